"""vLLM counters from the engines' /metrics: prefix-cache use summed over the fleet, and requests
served per engine (which attributes requests to engines with any vLLM, no header needed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from kvgate.contract import vllm

_COUNTERS = {
    vllm.total(vllm.PREFIX_CACHE_QUERIES): "queries",
    vllm.total(vllm.PREFIX_CACHE_HITS): "hits",
    vllm.total(vllm.EXTERNAL_PREFIX_CACHE_HITS): "external_hits",
    vllm.total(vllm.REQUEST_SUCCESS): "requests",
}


@dataclass(frozen=True, slots=True)
class CacheCounters:
    queries: float = 0.0  # prompt tokens looked up
    hits: float = 0.0  # tokens found in HBM
    external_hits: float = 0.0  # tokens found in the DDR pool
    requests: float = 0.0  # requests finished (vllm:request_success_total, every reason)

    def __sub__(self, other: CacheCounters) -> CacheCounters:
        return CacheCounters(self.queries - other.queries, self.hits - other.hits,
                             self.external_hits - other.external_hits,
                             self.requests - other.requests)

    def __add__(self, other: CacheCounters) -> CacheCounters:
        return CacheCounters(self.queries + other.queries, self.hits + other.hits,
                             self.external_hits + other.external_hits,
                             self.requests + other.requests)


def parse_counters(text: str) -> CacheCounters:
    sums = vllm.read_samples(text, _COUNTERS)
    return CacheCounters(**{key: sums.get(name, 0.0) for name, key in _COUNTERS.items()})


async def scrape_each(http: aiohttp.ClientSession,
                      engines: Sequence[str]) -> dict[str, CacheCounters] | None:
    """Each engine's counters by URL, or None when any engine cannot be read."""
    found: dict[str, CacheCounters] = {}
    for url in engines:
        try:
            async with http.get(f"{url.rstrip('/')}/metrics",
                                timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status != 200:
                    return None
                found[url] = parse_counters(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
    return found


async def scrape(http: aiohttp.ClientSession, engines: Sequence[str]) -> CacheCounters | None:
    """The fleet's counters, or None when any engine cannot be read."""
    each = await scrape_each(http, engines)
    if each is None:
        return None
    return sum(each.values(), CacheCounters())
