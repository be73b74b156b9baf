"""Discovery's metrics, per pool and source."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from kvgate.discovery.reconcile import Changes, Resolution


class DiscoveryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["pool", "source"]
        self.discovered = Gauge("kvgate_discovery_engines", "Engines the source's last good "
                                "answer named", labels, registry=registry)
        self.added = Counter("kvgate_discovery_added", "Engines a source added (new, or back "
                             "while leaving)", labels, registry=registry)
        self.removed = Counter("kvgate_discovery_removed", "Engines that left a source: "
                               "drained (`leaving`), then removed when the drain ended",
                               [*labels, "stage"], registry=registry)
        self.failures = Counter("kvgate_discovery_failures", "Resolutions that failed (the "
                                "source changed nothing)", labels, registry=registry)
        self.last_good = Gauge("kvgate_discovery_last_good_timestamp_seconds", "Unix time of "
                               "the source's last good answer", labels, registry=registry)
        self.held = Counter("kvgate_discovery_held", "Engines kept though their source lost "
                            "them: the round's removal bound", labels, registry=registry)

    def observed(self, pool: str, resolution: Resolution, changes: Changes) -> None:
        source = resolution.source
        if resolution.found is None:
            self.failures.labels(pool, source).inc()
            return
        self.discovered.labels(pool, source).set(len(resolution.found))
        self.last_good.labels(pool, source).set(resolution.at)
        self.added.labels(pool, source).inc(len(changes.added) + len(changes.returned))
        self.removed.labels(pool, source, "leaving").inc(len(changes.leaving))
        self.held.labels(pool, source).inc(len(changes.held))

    def expired(self, pool: str, changes: Changes) -> None:
        for engine in changes.removed:
            self.removed.labels(pool, engine.source, "removed").inc()
