"""An engine's /metrics (vLLM names) → running, waiting, KV usage, prefix-cache hit rate."""

from __future__ import annotations

from control_plane.operations import EndpointLoad
from kvgate.contract import vllm

_HITS = (vllm.total(vllm.PREFIX_CACHE_HITS), vllm.total(vllm.EXTERNAL_PREFIX_CACHE_HITS))
_QUERIES = vllm.total(vllm.PREFIX_CACHE_QUERIES)
_READ = (*_HITS, _QUERIES, vllm.NUM_REQUESTS_RUNNING, vllm.NUM_REQUESTS_WAITING,
         vllm.KV_CACHE_USAGE_PERC)


class LoadTracker:
    """Keeps the first counters it saw, so the hit rate covers this control plane's lifetime."""

    def __init__(self) -> None:
        self.current = EndpointLoad()
        self._first: tuple[float, float] | None = None

    def update(self, text: str) -> EndpointLoad:
        sums = vllm.read_samples(text, _READ)
        hits = sums.get(_HITS[0], 0.0) + sums.get(_HITS[1], 0.0)
        queries = sums.get(_QUERIES, 0.0)
        if self._first is None or queries < self._first[1]:  # first scrape, or engine restarted
            self._first = (hits, queries)
        asked = queries - self._first[1]
        self.current = EndpointLoad(
            running=sums.get(vllm.NUM_REQUESTS_RUNNING),
            waiting=sums.get(vllm.NUM_REQUESTS_WAITING),
            kv_cache_usage=sums.get(vllm.KV_CACHE_USAGE_PERC),
            hit_rate=(hits - self._first[0]) / asked if asked > 0 else None,
        )
        return self.current
