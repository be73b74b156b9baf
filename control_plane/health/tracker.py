"""Consecutive probe results → endpoint state, with Envoy-style thresholds. Pure."""

from __future__ import annotations


class HealthTracker:
    """`unhealthy_threshold` failures in a row fail an endpoint; `healthy_threshold` successes
    in a row bring a failed one back. A single blip changes nothing."""

    def __init__(self, unhealthy_threshold: int, healthy_threshold: int, failed: bool = False):
        self._unhealthy_threshold = unhealthy_threshold
        self._healthy_threshold = healthy_threshold
        self.failed = failed
        self._streak = 0

    def observe(self, ok: bool) -> bool | None:
        """Records one probe; returns the new `failed` value when it changes, else None."""
        if ok == (not self.failed):
            self._streak = 0
            return None
        self._streak += 1
        threshold = self._healthy_threshold if self.failed else self._unhealthy_threshold
        if self._streak < threshold:
            return None
        self.failed = not self.failed
        self._streak = 0
        return self.failed
