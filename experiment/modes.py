"""The routing modes a comparison runs, from the command line."""

from __future__ import annotations

from kvgate.contract.modes import RoutingMode

# What `--modes all` runs on a real stack; the simulator adds the peers' policies.
ALL_MODES: tuple[RoutingMode, ...] = tuple(m for m in RoutingMode if not m.simulated_only)


def parse_modes(text: str) -> tuple[RoutingMode, ...]:
    """Comma-separated mode names (``all`` = every mode)."""
    if text.strip() == "all":
        return ALL_MODES
    modes = []
    for name in text.split(","):
        try:
            modes.append(RoutingMode(name.strip()))
        except ValueError:
            raise ValueError(
                f"unknown mode {name.strip()!r} (choose from {', '.join(ALL_MODES)})"
            ) from None
    return tuple(modes)
