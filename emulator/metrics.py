"""Prometheus exposition of an engine's counters under vLLM's metric names (the names kvgate's
readers use too: kvgate.contract.vllm).

The model keeps plain integers (cheap on the hot path, readable by a simulator); this collector
turns them into metric families at scrape time. Each instance gets its own CollectorRegistry
because one process hosts several instances.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from emulator.engine_model import EngineModel
from kvgate.contract import vllm

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# vLLM's counters: name, help text, the ``EngineStats`` field that holds the value.
_COUNTERS = (
    (vllm.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens.",
     "prefix_cache_queries"),
    (vllm.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits"),
    (vllm.EXTERNAL_PREFIX_CACHE_QUERIES,
     "External prefix cache queries from KV connector, in terms of queried tokens.",
     "external_prefix_cache_queries"),
    (vllm.EXTERNAL_PREFIX_CACHE_HITS,
     "External prefix cache hits from KV connector, in terms of cached tokens.",
     "external_prefix_cache_hits"),
    (vllm.PROMPT_TOKENS, "Number of prefill tokens processed.", "prompt_tokens"),
    (vllm.GENERATION_TOKENS, "Number of generation tokens processed.", "generation_tokens"),
    (vllm.REQUEST_SUCCESS, "Count of successfully processed requests.", "requests"),
)  # fmt: skip


class EngineCollector(Collector):
    """Collects one instance's vLLM metrics, labelled with ``model_name``."""

    def __init__(self, model: EngineModel, now: Callable[[], float]) -> None:
        self._model = model
        self._now = now

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families (called by the registry on every scrape)."""
        model = self._model
        stats = model.stats
        labels = ["model_name"]
        values = [model.config.model]
        for name, doc, field in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, getattr(stats, field))
            yield family
        now = self._now()
        running, waiting = model.occupancy(now)
        for name, doc, value in (
            (vllm.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.",
             running),
            (vllm.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", waiting),
            (vllm.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.",
             model.usage(now)),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        yield self._ttft(labels, values)

    def _ttft(self, labels: list[str], values: list[str]) -> HistogramMetricFamily:
        """The TTFT histogram, its buckets cumulative as Prometheus wants them."""
        hist = self._model.stats.ttft
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip(hist.bounds, hist.counts, strict=False):
            cumulative += count
            buckets.append((repr(float(bound)), cumulative))
        buckets.append(("+Inf", hist.count))
        family = HistogramMetricFamily(
            vllm.TIME_TO_FIRST_TOKEN_SECONDS,
            "Histogram of time to first token in seconds.",
            labels=labels,
        )
        family.add_metric(values, buckets, hist.total)
        return family


def make_registry(model: EngineModel, now: Callable[[], float]) -> CollectorRegistry:
    """A registry holding only this instance's collector (which builds its families at scrape
    time, so it has no names to describe: a ``name[]`` filter then filters its samples)."""
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(EngineCollector(model, now))
    return registry


def render(registry: CollectorRegistry, names: Sequence[str] = ()) -> bytes:
    """Prometheus text exposition of ``registry``, only the samples ``names`` if any are given
    (the ``name[]`` filter of prometheus_client's exposition, which vLLM serves)."""
    return generate_latest(registry.restricted_registry(names) if names else registry)


def page(registry: CollectorRegistry, path: str, names: Sequence[str]) -> bytes:
    """What vLLM 0.32 serves at ``path`` asked for ``names`` (``?name[]=...``): /metrics is
    prometheus-fastapi-instrumentator's route, which ignores the filter; /metrics/ reaches the
    prometheus_client app vLLM mounts beside it, which honours it
    (vllm/entrypoints/serve/instrumentator/metrics.py, attach_router; prometheus_client
    exposition.py, _bake_output)."""
    return render(registry, names if path == "/metrics/" else ())


def stats_body(model: EngineModel, now: float) -> dict[str, Any]:
    """``GET /admin/stats``'s counters, HBM blocks and occupancy (the server adds who it is)."""
    stats = model.stats
    running, waiting = model.occupancy(now)
    return {
        "requests": stats.requests,
        "prefix_cache_queries": stats.prefix_cache_queries,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "external_prefix_cache_queries": stats.external_prefix_cache_queries,
        "external_prefix_cache_hits": stats.external_prefix_cache_hits,
        "hbm_blocks": len(model.cache),
        "hbm_capacity_blocks": model.cache.capacity_blocks,
        "running": running,
        "waiting": waiting,
    }
