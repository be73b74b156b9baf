"""Names shared by the resources, Envoy's filter chain and the ext_proc service."""

from __future__ import annotations

# Dynamic metadata namespace and key that override_host reads the picked host(s) from.
LB_NAMESPACE = "envoy.lb"
DESTINATION_KEY = "x-gateway-destination-endpoint"
# gRPC initial metadata telling ext_proc which pool the matched route serves.
POOL_METADATA_KEY = "x-kvgate-pool"
# The same, as a request header the route sets for the HTTP transport (a client-sent copy is
# stripped before the route sets it).
POOL_HEADER = POOL_METADATA_KEY
# gRPC initial metadata a prefill/decode pool's routes add: ext_proc serves that stream in full
# (headers, then the buffered body: the two-stage wire), the others with one answer.
PD_METADATA_KEY = "x-kvgate-pd"
# ... and a colocated pool's routes with the prefix step on: ext_proc may ask for the body of a
# request whose decision weighs its prompt (a per-request mode override), on the same stream.
PROMPT_METADATA_KEY = "x-kvgate-prompt"

LISTENER_NAME = "kvgate_gateway"
ROUTE_CONFIG_NAME = "kvgate_routes"
EXT_PROC_CLUSTER = "kvgate_ext_proc"
XDS_CLUSTER = "kvgate_xds"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
HEADER_MUTATION_FILTER = "envoy.filters.http.header_mutation"
# The router's upstream filter that drops the session key per attempt. A name of its own: Envoy
# hands a route's per-filter config to every filter of that name, upstream ones included, and
# the HTTP transport's per-route config *adds* the pool header (it reached engines).
UPSTREAM_HEADER_MUTATION_FILTER = "kvgate.upstream.header_mutation"
# What Envoy's health check of the ext_proc replicas asks for: the gRPC health service name, or
# over the HTTP transport the path. Not serving while the replica cannot reach etcd
# (ext_proc.readiness); the overall gRPC health ("") stays serving for liveness probes.
DECISIONS_HEALTH_SERVICE = "kvgate.decisions"
DECISIONS_HEALTH_PATH = "/health/decisions"

# Envoy's ring_hash defaults, pinned so ext_proc can rebuild the identical ring.
RING_MIN_SIZE = 1024
RING_MAX_SIZE = 8 * 1024 * 1024


def pool_cluster_name(pool: str) -> str:
    return f"kvgate_pool_{pool}"
