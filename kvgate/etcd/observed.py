"""What a service saw of etcd failures: counted by kind for metrics, the latest kept for status."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from kvgate.etcd.errors import EtcdError, EtcdErrorKind


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
