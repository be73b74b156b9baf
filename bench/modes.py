"""The routing modes compared, and what each means for the gateway and the fleet."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    ROUND_ROBIN = "round_robin"  # the bank's old setup: any request to any engine
    RING_HASH = "ring_hash"  # plain Envoy ring_hash on the session header
    AFFINITY = "affinity"  # kvgate, engines without a DDR pool
    AFFINITY_DDR = "affinity+ddr"  # kvgate, engines sharing a DDR KV pool

    @property
    def ddr_pool(self) -> bool:
        return self is Mode.AFFINITY_DDR


ALL_MODES: tuple[Mode, ...] = tuple(Mode)


def parse_modes(text: str) -> tuple[Mode, ...]:
    """Comma-separated mode names (``all`` = every mode)."""
    if text.strip() == "all":
        return ALL_MODES
    modes = []
    for name in text.split(","):
        try:
            modes.append(Mode(name.strip()))
        except ValueError:
            raise ValueError(
                f"unknown mode {name.strip()!r} (choose from {', '.join(ALL_MODES)})"
            ) from None
    return tuple(modes)
