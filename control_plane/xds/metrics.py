"""xDS server metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class XdsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "kvgate_xds_connected_streams", "Envoy ADS streams open", registry=registry
        )
        self.responses = Counter(
            "kvgate_xds_responses", "Discovery responses sent", ["type"], registry=registry
        )
        self.nacks = Counter(
            "kvgate_xds_nacks", "Responses Envoy rejected", ["type"], registry=registry
        )
        self.stale = Counter(
            "kvgate_xds_stale_requests", "Requests with an outdated nonce (ignored)",
            registry=registry,
        )
