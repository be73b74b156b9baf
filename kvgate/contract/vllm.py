"""vLLM's /metrics as kvgate reads them and the emulator writes them: the metric names, and the
one reader of a Prometheus text page that ext_proc, the control plane and bench share.

Names are the metric families as vLLM declares them; a counter's samples carry `_total`
(`total(PREFIX_CACHE_HITS)`), a histogram's `_sum`, `_count` and `_bucket`.
"""

from __future__ import annotations

from collections.abc import Iterable

# Counters, in tokens: what the prefix cache was asked for and found (HBM), and what the KV
# connector found in the external tier (the DDR pool).
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
EXTERNAL_PREFIX_CACHE_QUERIES = "vllm:external_prefix_cache_queries"
EXTERNAL_PREFIX_CACHE_HITS = "vllm:external_prefix_cache_hits"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # requests finished, every reason
# Gauges.
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"  # prefilling or decoding
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"  # not scheduled yet (or loading KV)
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"  # 0..1
# Histogram.
TIME_TO_FIRST_TOKEN_SECONDS = "vllm:time_to_first_token_seconds"


def total(counter: str) -> str:
    """A counter family's sample name."""
    return f"{counter}_total"


def read_samples(text: str, names: Iterable[str]) -> dict[str, float]:
    """Each named sample (e.g. `total(PREFIX_CACHE_HITS)`) summed over its label sets; a name
    with no sample on the page is absent. A line scan, not a full parse: a real vLLM page is
    tens of KB of histograms, and the load gate reads one per engine every 100 ms."""
    sums: dict[str, float] = {}
    for name in names:
        at = text.find(name)
        while at != -1:
            after = at + len(name)
            # A sample line starts with the name, followed by labels or a space (not by a
            # longer name that shares the prefix).
            if (at == 0 or text[at - 1] == "\n") and text[after:after + 1] in ("{", " "):
                end = text.find("\n", after)
                value = _value(text[after:] if end == -1 else text[after:end])
                if value is not None:
                    sums[name] = sums.get(name, 0.0) + value
            at = text.find(name, after)
    return sums


def _value(rest: str) -> float | None:
    """The value in what follows a sample's name: `{labels} value [timestamp]`."""
    if rest.startswith("{"):
        close = rest.rfind("}")  # label values may hold braces; the value and time cannot
        if close == -1:
            return None
        rest = rest[close + 1:]
    fields = rest.split()
    if not fields:
        return None
    try:
        return float(fields[0])
    except ValueError:
        return None
