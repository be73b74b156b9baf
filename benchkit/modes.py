"""The routing modes a comparison runs, from the command line."""

from __future__ import annotations

import argparse

from kvgate.contract.modes import RoutingMode

# What `--modes all` runs on a real stack; the simulator adds the peers' policies.
ALL_MODES: tuple[RoutingMode, ...] = tuple(m for m in RoutingMode if not m.simulated_only)
SIMULATED_MODES: tuple[RoutingMode, ...] = tuple(RoutingMode)


class ModeError(ValueError, argparse.ArgumentTypeError):
    """A mode name that is not one (argparse shows its message as it is)."""


def parse_modes(text: str, every: tuple[RoutingMode, ...] = ALL_MODES,
                ) -> tuple[RoutingMode, ...]:
    """Comma-separated mode names (``all`` = ``every``, by default the real stack's modes)."""
    if text.strip() == "all":
        return every
    modes = []
    for name in text.split(","):
        try:
            mode = RoutingMode(name.strip())
        except ValueError:
            raise ModeError(
                f"unknown mode {name.strip()!r} (choose from {', '.join(every)})"
            ) from None
        if mode not in every:
            raise ModeError(f"mode {mode} runs in kvgate simulate and plan only (choose from "
                            f"{', '.join(every)})")
        modes.append(mode)
    return tuple(modes)


def parse_simulated_modes(text: str) -> tuple[RoutingMode, ...]:
    """`kvgate simulate --modes`: the peers' policies too."""
    return parse_modes(text, SIMULATED_MODES)
