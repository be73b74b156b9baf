"""Names shared by the xDS builders, Envoy's filter chain, the ext_proc service and the ring
rebuild (kvgate.placement.ring)."""

from __future__ import annotations

# Dynamic metadata namespace and key that override_host reads the picked host(s) from. The key is
# also a request header no client may set: the listener strips it, the config refuses it as a
# session header.
LB_NAMESPACE = "envoy.lb"
DESTINATION_KEY = "x-gateway-destination-endpoint"
# gRPC initial metadata telling ext_proc which pool the matched route serves.
POOL_METADATA_KEY = "x-kvgate-pool"

LISTENER_NAME = "kvgate_gateway"
ROUTE_CONFIG_NAME = "kvgate_routes"
EXT_PROC_CLUSTER = "kvgate_ext_proc"
XDS_CLUSTER = "kvgate_xds"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"

# Envoy's ring_hash defaults, pinned in the clusters so ext_proc rebuilds the identical ring.
RING_MIN_SIZE = 1024
RING_MAX_SIZE = 8 * 1024 * 1024


def pool_cluster_name(pool: str) -> str:
    return f"kvgate_pool_{pool}"
