"""What a request waiting on an engine is assumed to need: the mean prefill this replica books.
Here, below routing, because the engines' figures turn their waiting counts into seconds with it
as they arrive (`feed`, `kvgate.routing.engine_load`); the load gate's ledger adds to it."""

from __future__ import annotations


class PrefillMix:
    """A running mean of the prefill seconds this replica books per request: the plain mean of
    the first 100, then an exponential one over about the last 100. What a request waiting on
    an engine (`vllm:num_requests_waiting`) is assumed to need."""

    def __init__(self) -> None:
        self.mean_s = 0.0
        self._seen = 0

    def add(self, seconds: float) -> None:
        if self._seen < 100:
            self._seen += 1
            self.mean_s += (seconds - self.mean_s) / self._seen
        else:
            self.mean_s += (seconds - self.mean_s) * 0.01
