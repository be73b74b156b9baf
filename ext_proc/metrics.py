"""ext_proc's Prometheus metrics, in a registry owned by the service (no global state): the
decisions' (kvgate.routing.handler, told the service's name), then the binding store's."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from kvgate.routing.handler import DecisionMetrics

# What the core's parts name their metrics after here (`kvgate_ext_proc_*`) and label them with.
SERVICE = "ext_proc"


class ExtProcMetrics(DecisionMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(SERVICE, registry)
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
        for reason in ("pending_full", "max_bindings"):
            self.unbound.labels(reason)
        self.prompts_read = Counter(
            "kvgate_ext_proc_prompts_read", "Request bodies asked of Envoy to place by the "
            "prompt's leading blocks (the prefix step: new sessions and moves for load only)",
            registry=self.registry,
        )

    def track(
        self, bindings: Callable[[], float], pending: Callable[[], float],
        degraded: Callable[[], float],
    ) -> None:
        self.bindings.set_function(bindings)
        self.pending.set_function(pending)
        self.degraded.set_function(degraded)
