"""ext_proc's Prometheus metrics, in a registry owned by the service (no global state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ExtProcMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.decisions = Counter(
            "kvgate_ext_proc_decisions", "Routing decisions by outcome",
            ["outcome"], registry=self.registry,
        )
        self.session_sources = Counter(
            "kvgate_ext_proc_session_sources", "Where each request's session id came from",
            ["source"], registry=self.registry,
        )
        self.latency = Histogram(
            "kvgate_ext_proc_decision_seconds", "Time to decide one request",
            buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1),
            registry=self.registry,
        )
        self.etcd_errors = Counter(
            "kvgate_ext_proc_etcd_errors", "etcd calls that failed", registry=self.registry
        )
        self.bindings = Gauge(
            "kvgate_ext_proc_bindings", "Bindings in the local cache", registry=self.registry
        )
        self.pending = Gauge(
            "kvgate_ext_proc_pending_writes", "Bindings waiting for etcd", registry=self.registry
        )
        self.degraded = Gauge(
            "kvgate_ext_proc_degraded", "1 while etcd takes no writes and new bindings queue",
            registry=self.registry,
        )
        self.unbound = Counter(
            "kvgate_ext_proc_unbound", "New sessions routed on Envoy's ring without a binding, "
            "by reason (pending_full, max_bindings)", ["reason"], registry=self.registry,
        )
        self.rebinds = Counter(
            "kvgate_ext_proc_rebinds", "Sessions this replica moved to another endpoint, by "
            "reason (failed, drained: their endpoint left; load: the load gate found a DDR-pool "
            "sibling that answers sooner; manual is the control plane's)", ["reason"],
            registry=self.registry,
        )
        for reason in ("failed", "drained", "load", "manual"):
            self.rebinds.labels(reason)
        for outcome in ("sticky", "new", "rebind", "sessionless", "unbound", "error"):
            self.decisions.labels(outcome)
        for source in ("header", "body", "implicit", "none"):
            self.session_sources.labels(source)
        for reason in ("pending_full", "max_bindings"):
            self.unbound.labels(reason)

    def track(
        self, bindings: Callable[[], float], pending: Callable[[], float],
        degraded: Callable[[], float],
    ) -> None:
        self.bindings.set_function(bindings)
        self.pending.set_function(pending)
        self.degraded.set_function(degraded)
