"""Everything Envoy needs, as one set of xDS resources by type: what the ADS snapshot holds."""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.message import Message

from control_plane.resources.affinity import affinity_keys
from control_plane.resources.clusters import ext_proc_cluster, pool_cluster
from control_plane.resources.endpoints import load_assignment
from control_plane.resources.listener import gateway_listener
from control_plane.resources.routes import route_configuration
from control_plane.resources.types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from kvgate.config.model import Config
from kvgate.contract.states import EndpointState


def gateway_resources(
    config: Config, states: Mapping[str, Mapping[str, EndpointState]] | None = None
) -> dict[str, dict[str, Message]]:
    """`states` maps pool → `ip:port` → active/draining/failed (EDS health status)."""
    states = states or {}
    clusters = [pool_cluster(pool, eds=True) for pool in config.pools]
    clusters.append(ext_proc_cluster(config.ext_proc, affinity_keys(config.session)))
    assignments = [load_assignment(pool, states.get(pool.name)) for pool in config.pools]
    listener = gateway_listener(config)
    routes = route_configuration(config)
    return {
        CLUSTER: {c.name: c for c in clusters},
        ENDPOINT: {a.cluster_name: a for a in assignments},
        LISTENER: {listener.name: listener},
        ROUTE: {routes.name: routes},
    }
