"""ClusterLoadAssignments: the pool's engines, with the health status kvgate decided."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from control_plane.resources import protos
from kvgate.config.model import HostPort, Pool
from kvgate.contract.envoy import pool_cluster_name
from kvgate.contract.states import EndpointState

# kvgate endpoint state → EDS health status; Envoy neither overrides to nor hashes onto
# the last two.
HEALTH_BY_STATE = {
    EndpointState.ACTIVE: health_check_pb2.HEALTHY,
    EndpointState.DRAINING: health_check_pb2.DRAINING,
    EndpointState.FAILED: health_check_pb2.UNHEALTHY,
}


def load_assignment(
    pool: Pool, states: Mapping[str, EndpointState] | None = None
) -> endpoint_pb2.ClusterLoadAssignment:
    """The pool's endpoints; `states` maps `ip:port` to active/draining/failed (default active).
    Prefill engines are left out: only ext_proc calls them (the two-stage wire), so neither a
    client nor Envoy's ring fallback ever reaches one."""
    states = states or {}
    return _assignment(pool_cluster_name(pool.name), (
        endpoint_components_pb2.LbEndpoint(
            endpoint=_endpoint(ep.address),
            health_status=HEALTH_BY_STATE[states.get(ep.key, EndpointState.ACTIVE)],
            load_balancing_weight=protos.u32(ep.weight),
        )
        for ep in pool.endpoints if ep.role.decodes
    ))


def static_hosts(cluster: str, addresses: Iterable[HostPort]) -> endpoint_pb2.ClusterLoadAssignment:
    return _assignment(cluster, (endpoint_components_pb2.LbEndpoint(endpoint=_endpoint(address))
                                 for address in addresses))


def _assignment(cluster: str, hosts: Iterable[endpoint_components_pb2.LbEndpoint]
                ) -> endpoint_pb2.ClusterLoadAssignment:
    """`cluster`'s hosts, in one locality."""
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster,
        endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=list(hosts))],
    )


def _endpoint(address: HostPort) -> endpoint_components_pb2.Endpoint:
    return endpoint_components_pb2.Endpoint(address=protos.socket_address(address))
