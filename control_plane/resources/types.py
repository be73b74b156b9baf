"""xDS resource type URLs, in the order ADS must send them (make before break)."""

from __future__ import annotations

_PREFIX = "type.googleapis.com/"
CLUSTER = _PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = _PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = _PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = _PREFIX + "envoy.config.route.v3.RouteConfiguration"

TYPE_ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE)
# Types whose requests name the resources they want (the others are wildcard subscriptions).
NAMED = (ENDPOINT, ROUTE)


def short(type_url: str) -> str:
    return {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS"}.get(type_url, type_url)
