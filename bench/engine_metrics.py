"""vLLM prefix-cache counters from the engines' /metrics, summed over the fleet."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

_COUNTERS = {
    "vllm:prefix_cache_queries": "queries",
    "vllm:prefix_cache_hits": "hits",
    "vllm:external_prefix_cache_hits": "external_hits",
}


@dataclass(frozen=True, slots=True)
class CacheCounters:
    queries: float = 0.0  # prompt tokens looked up
    hits: float = 0.0  # tokens found in HBM
    external_hits: float = 0.0  # tokens found in the DDR pool

    def __sub__(self, other: CacheCounters) -> CacheCounters:
        return CacheCounters(self.queries - other.queries, self.hits - other.hits,
                             self.external_hits - other.external_hits)


def parse_counters(text: str) -> CacheCounters:
    found = dict.fromkeys(_COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        key = _COUNTERS.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                found[key] += sample.value
    return CacheCounters(**found)


async def scrape(http: aiohttp.ClientSession, engines: Sequence[str]) -> CacheCounters | None:
    """The fleet's counters, or None when any engine cannot be read."""
    total = CacheCounters()
    for url in engines:
        try:
            async with http.get(f"{url.rstrip('/')}/metrics",
                                timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status != 200:
                    return None
                counters = parse_counters(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        total = CacheCounters(total.queries + counters.queries, total.hits + counters.hits,
                              total.external_hits + counters.external_hits)
    return total
