"""Inter-token latencies as weighted samples: a value (seconds) seen by a number of streamed
tokens. A simulator adds whole spans of a stream at once (``n`` tokens ``s`` apart), so the
samples are binned at 0.1 ms and their percentiles are token-weighted, as a streaming client's
(vLLM's ``benchmark_serving`` pools every inter-token gap of every request)."""

from __future__ import annotations

from dataclasses import dataclass, field

_BIN = 1e-4  # seconds per bin: 0.1 ms


@dataclass(slots=True)
class ItlSamples:
    weights: dict[int, float] = field(default_factory=dict)  # bin -> tokens

    def add(self, seconds: float, tokens: float) -> None:
        """``tokens`` gaps of ``seconds`` each (fractional: a share of a step)."""
        if tokens > 0:
            key = round(seconds / _BIN)
            self.weights[key] = self.weights.get(key, 0.0) + tokens

    @property
    def tokens(self) -> float:
        return sum(self.weights.values())

    def percentile(self, pct: float) -> float | None:
        """Nearest-rank, token-weighted (None: no gap was seen)."""
        total = self.tokens
        if total <= 0:
            return None
        target = pct / 100 * total
        seen = 0.0
        ordered = sorted(self.weights)
        for key in ordered:
            seen += self.weights[key]
            if seen >= target - 1e-9 * total:
                return key * _BIN
        return ordered[-1] * _BIN
