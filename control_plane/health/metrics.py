"""The health checker's metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.probes = Counter(
            "kvgate_health_probes", "Health probes by result: ok, failed, or inconclusive (timed "
            "out while this control plane's event loop was stalled; not counted either way)",
            ["pool", "result"], registry=registry,
        )
        self.held = Counter(
            "kvgate_health_guard_held", "Engines probes called dead but the guard kept active, "
            "because health.max_failed_fraction of their pool was already failed",
            ["pool"], registry=registry,
        )
        self.holding = Gauge(
            "kvgate_health_guard_holding", "Engines probes call dead that the guard keeps active",
            ["pool"], registry=registry,
        )
