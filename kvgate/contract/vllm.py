"""vLLM's /metrics as kvgate reads them and the emulator writes them: the metric names, the
gauges the load gate reads (`GAUGES`: one table for the scrapers, the collector's stream and the
simulator), and the one reader of a Prometheus text page that ext_proc, the control plane and
bench share.

Names are the metric families as vLLM declares them; a counter's samples carry `_total`
(`total(PREFIX_CACHE_HITS)`), a histogram's `_sum`, `_count` and `_bucket`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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




@dataclass(frozen=True, slots=True)
class Gauge:
    """One gauge an engine reports that the load gate reads."""

    name: str  # kvgate's name: EngineFigures.get(name), the collector stream's column
    metric: str  # vLLM's family
    integer: bool = False  # a count (read as an int, a uint32 column in the stream)


# Every engine-reported gauge kvgate reads, in the order EngineFigures keeps them. A new one is a
# row here, its column in admin.proto's EngineLoads (same name), and its value in the simulator
# (simulator/observe.py); a scoring term reads it as `EngineSignals.gauge(name)`.
GAUGES = (
    Gauge("waiting", NUM_REQUESTS_WAITING, integer=True),  # priced as backlog
    Gauge("running", NUM_REQUESTS_RUNNING, integer=True),
    Gauge("kv_usage", KV_CACHE_USAGE_PERC),
)
GAUGE_INDEX: Mapping[str, int] = {g.name: i for i, g in enumerate(GAUGES)}
_WAITING, _RUNNING, _KV_USAGE = (GAUGE_INDEX[n] for n in ("waiting", "running", "kv_usage"))


class EngineFigures:
    """One engine's gauges, in `GAUGES` order, as one scrape (or the collector's stream, or the
    simulator) read them."""

    __slots__ = ("values",)

    def __init__(self, values: Sequence[float] | None = None) -> None:
        self.values: tuple[float, ...] = (
            tuple(0 if g.integer else 0.0 for g in GAUGES) if values is None else tuple(values))

    @classmethod
    def of(cls, **named: float) -> EngineFigures:
        """By gauge name; a gauge not named reads 0."""
        unknown = named.keys() - GAUGE_INDEX.keys()
        if unknown:
            raise ValueError(f"not gauges: {', '.join(sorted(unknown))}")
        return cls([named.get(g.name, 0 if g.integer else 0.0) for g in GAUGES])

    @classmethod
    def read(cls, sums: Mapping[str, float]) -> EngineFigures:
        """From a page's samples (`read_samples(text, (g.metric for g in GAUGES))`)."""
        return cls([int(sums.get(g.metric, 0.0)) if g.integer else sums.get(g.metric, 0.0)
                    for g in GAUGES])

    def get(self, name: str) -> float:
        return self.values[GAUGE_INDEX[name]]

    @property
    def waiting(self) -> int:
        """Requests not scheduled yet: each still needs its prefill (priced as backlog)."""
        return int(self.values[_WAITING])

    @property
    def running(self) -> int:
        return int(self.values[_RUNNING])

    @property
    def kv_usage(self) -> float:
        return self.values[_KV_USAGE]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EngineFigures) and self.values == other.values

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return "EngineFigures.of(" + ", ".join(
            f"{g.name}={v!r}" for g, v in zip(GAUGES, self.values, strict=True)) + ")"


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
