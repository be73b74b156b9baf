"""An engine's /metrics (vLLM names) → running, waiting, KV usage, prefix-cache hit rate."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from control_plane.operations import EndpointLoad


def _sums(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


class LoadTracker:
    """Keeps the first counters it saw, so the hit rate covers this control plane's lifetime."""

    def __init__(self) -> None:
        self.current = EndpointLoad()
        self._first: tuple[float, float] | None = None

    def update(self, text: str) -> EndpointLoad:
        sums = _sums(text)
        hits = sums.get("vllm:prefix_cache_hits_total", 0.0) + sums.get(
            "vllm:external_prefix_cache_hits_total", 0.0)
        queries = sums.get("vllm:prefix_cache_queries_total", 0.0)
        if self._first is None or queries < self._first[1]:  # first scrape, or engine restarted
            self._first = (hits, queries)
        asked = queries - self._first[1]
        self.current = EndpointLoad(
            running=sums.get("vllm:num_requests_running"),
            waiting=sums.get("vllm:num_requests_waiting"),
            kv_cache_usage=sums.get("vllm:kv_cache_usage_perc"),
            hit_rate=(hits - self._first[0]) / asked if asked > 0 else None,
        )
        return self.current
