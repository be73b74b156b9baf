"""What a service saw of etcd failures: counted by kind for metrics, the latest kept for status."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvgate.etcd.errors import EtcdError, EtcdErrorKind
from kvgate.etcd.mirror import MirrorState, MirrorStatus, PrefixMirror


@dataclass(frozen=True, slots=True)
class EtcdErrorSeen:
    kind: str
    count: int  # since the service started
    error: str  # the latest one of this kind
    last_at: float  # unix time


class EtcdErrorLog:
    """Pass as `EtcdClient(on_error=...)`: counts `kvgate_etcd_errors_total{service,kind}`."""

    def __init__(
        self, service: str, registry: CollectorRegistry, clock: Callable[[], float] = time.time
    ) -> None:
        self._service = service
        self._clock = clock
        self._counter = Counter(
            "kvgate_etcd_errors", "etcd calls that failed, by kind", ["service", "kind"],
            registry=registry,
        )
        for kind in EtcdErrorKind:
            self._counter.labels(service, str(kind))
        self._seen: dict[str, EtcdErrorSeen] = {}

    def __call__(self, error: EtcdError) -> None:
        kind = str(error.kind)
        self._counter.labels(self._service, kind).inc()
        before = self._seen.get(kind)
        self._seen[kind] = EtcdErrorSeen(kind, (before.count if before else 0) + 1, str(error),
                                         self._clock())

    def recent(self, within: float = 300.0) -> list[EtcdErrorSeen]:
        """Each kind seen in the last `within` seconds, newest first."""
        since = self._clock() - within
        return sorted((s for s in self._seen.values() if s.last_at >= since),
                      key=lambda s: s.last_at, reverse=True)


class MirrorMetrics(Collector):
    """Every etcd mirror of a service, per mirror: `kvgate_etcd_mirror_synced{service,mirror}`
    (1 only while it holds etcd's current content and watches it: 0 while listing or stale),
    the revision its copy is at, and how often it had to relist."""

    def __init__(self, service: str, registry: CollectorRegistry) -> None:
        self._service = service
        self._mirrors: list[PrefixMirror] = []
        registry.register(self)

    def track(self, mirror: PrefixMirror) -> PrefixMirror:
        self._mirrors.append(mirror)
        return mirror

    def statuses(self) -> list[MirrorStatus]:
        return [m.status() for m in self._mirrors]

    def collect(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["service", "mirror"]
        synced = GaugeMetricFamily(
            "kvgate_etcd_mirror_synced", "1 while the mirror holds etcd's current content and "
            "watches it; 0 while it lists or has lost etcd (it serves its last copy)",
            labels=labels)
        revision = GaugeMetricFamily(
            "kvgate_etcd_mirror_revision", "the etcd revision the mirror's copy is at",
            labels=labels)
        relists = CounterMetricFamily(
            "kvgate_etcd_mirror_relists", "listings after the first (each after a lost watch)",
            labels=labels)
        for mirror in self._mirrors:
            values = [self._service, mirror.name]
            synced.add_metric(values, 1.0 if mirror.state == MirrorState.SYNCED else 0.0)
            revision.add_metric(values, float(mirror.revision))
            relists.add_metric(values, float(mirror.relists))
        return [synced, revision, relists]
