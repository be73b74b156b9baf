"""Pure builders: kvgate Config → Envoy xDS messages. No I/O, no state."""

from control_plane.resources.bootstrap import static_bootstrap
from control_plane.resources.clusters import ext_proc_cluster, pool_cluster
from control_plane.resources.endpoints import load_assignment
from control_plane.resources.listener import gateway_listener
from control_plane.resources.routes import route_configuration

__all__ = [
    "ext_proc_cluster", "gateway_listener", "load_assignment", "pool_cluster",
    "route_configuration", "static_bootstrap",
]
