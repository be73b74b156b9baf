"""The load gate's settings (`placement.load_gate` in the YAML; the config's section reads them
from here). The gate itself, filter → score → pick with estimated TTFT as the score, is
`kvgate.routing.gated.GatedPolicy`."""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.placement.terms import DEFAULT_TERMS


@dataclass(frozen=True, slots=True)
class GateConfig:
    """`placement.load_gate` in the YAML."""

    enabled: bool = True
    min_saving_s: float = 1.5  # more than a user notices; see docs/benchmarks.md
    min_saving_ratio: float = 0.3
    cooldown_s: float = 30.0
    candidates: int = 8  # endpoints scored per decision (ring order); 1: static ring placement
    # Move only if the move is no slower even when the pool no longer holds the context.
    miss_safe: bool = True
    terms: tuple[str, ...] = DEFAULT_TERMS  # the score's terms (kvgate.placement.terms)

    def problems(self) -> list[str]:
        checks = (
            (self.min_saving_s >= 0, "min_saving_s must be >= 0"),
            (0 <= self.min_saving_ratio <= 1, "min_saving_ratio must be in 0..1"),
            (self.cooldown_s >= 0, "cooldown_s must be >= 0"),
            (self.candidates >= 1, "candidates must be >= 1"),
        )
        return [text for ok, text in checks if not ok]
