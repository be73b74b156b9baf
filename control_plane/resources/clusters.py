"""Clusters: one per pool (override_host with a ring_hash fallback) and one for ext_proc."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import config_source_pb2, health_check_pb2, protocol_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.metadata.v3 import metadata_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf.message import Message

from control_plane.resources import protos
from control_plane.resources.endpoints import load_assignment, static_hosts
from kvgate.config.model import ExtProc, HostPort, Pool
from kvgate.contract.envoy import (
    DECISIONS_HEALTH_PATH,
    DECISIONS_HEALTH_SERVICE,
    DESTINATION_KEY,
    EXT_PROC_CLUSTER,
    LB_NAMESPACE,
    RING_MAX_SIZE,
    RING_MIN_SIZE,
    pool_cluster_name,
)
from kvgate.contract.modes import RoutingMode

# Envoy honours an override even to a DRAINING or UNHEALTHY host; only these may be overridden to.
OVERRIDABLE = (health_check_pb2.HEALTHY, health_check_pb2.UNKNOWN)
# Long-context streams at peak: default circuit breakers (1024 requests) would cap a busy pool.
_MANY = 1_000_000


def pool_cluster(
    pool: Pool, *, eds: bool, mode: RoutingMode = RoutingMode.AFFINITY
) -> cluster_pb2.Cluster:
    """The pool's cluster: ext_proc's pick via override_host, else ring_hash on the session."""
    cluster = cluster_pb2.Cluster(
        name=pool_cluster_name(pool.name),
        connect_timeout=protos.duration(1.0),
        load_balancing_policy=_balancing(mode),
        circuit_breakers=_generous_limits(max_retries=1024),
        common_lb_config=cluster_pb2.Cluster.CommonLbConfig(
            override_host_status=health_check_pb2.HealthStatusSet(statuses=OVERRIDABLE),
            # A failed engine is really gone; never spread traffic back onto it in "panic".
            healthy_panic_threshold=percent_pb2.Percent(value=0.0),
        ),
    )
    if eds:
        cluster.type = cluster_pb2.Cluster.EDS
        cluster.eds_cluster_config.CopyFrom(
            cluster_pb2.Cluster.EdsClusterConfig(
                eds_config=config_source_pb2.ConfigSource(
                    ads=config_source_pb2.AggregatedConfigSource(),
                    resource_api_version=config_source_pb2.V3,
                )
            )
        )
    else:
        cluster.type = cluster_pb2.Cluster.STATIC
        cluster.load_assignment.CopyFrom(load_assignment(pool))
    return cluster


def _policy(name: str, config: Message) -> cluster_pb2.LoadBalancingPolicy:
    return cluster_pb2.LoadBalancingPolicy(
        policies=[
            cluster_pb2.LoadBalancingPolicy.Policy(
                typed_extension_config=protos.typed_extension(name, config)
            )
        ]
    )


def _balancing(mode: RoutingMode) -> cluster_pb2.LoadBalancingPolicy:
    ring = _policy(
        "envoy.load_balancing_policies.ring_hash",
        ring_hash_pb2.RingHash(
            hash_function=ring_hash_pb2.RingHash.XX_HASH,
            minimum_ring_size=protos.u64(RING_MIN_SIZE),
            maximum_ring_size=protos.u64(RING_MAX_SIZE),
        ),
    )
    if mode is RoutingMode.RING_HASH:
        return ring
    if mode.round_robin:
        return _policy("envoy.load_balancing_policies.round_robin", round_robin_pb2.RoundRobin())
    override = override_host_pb2.OverrideHost(
        override_host_sources=[
            override_host_pb2.OverrideHost.OverrideHostSource(
                metadata=metadata_pb2.MetadataKey(
                    key=LB_NAMESPACE,
                    path=[metadata_pb2.MetadataKey.PathSegment(key=DESTINATION_KEY)],
                )
            )
        ],
        fallback_policy=ring,
    )
    return _policy("envoy.load_balancing_policies.override_host", override)


def ext_proc_cluster(ext_proc: ExtProc, affinity_keys: Sequence[str] = ()
                     ) -> cluster_pb2.Cluster:
    """The ext_proc replicas, skipped by Envoy when their health check fails: gRPC health, or
    over the HTTP transport a GET on the same HTTP/1.1 port. A replica that cannot reach etcd
    fails it on purpose (ext_proc.readiness); only when none passes does Envoy's panic mode send
    to all of them again (they then route from memory).

    Over gRPC, one session's requests go to one replica while it is healthy: the ext_proc filter
    copies where the session was found into the stream's initial metadata (affinity.py), and
    this cluster hashes those `affinity_keys` on a ring. Replicas learn each other's moves only
    through etcd's watch, milliseconds late, and each keeps its own cooldowns: picked per
    request, a session's next turn could reach a replica that has not seen its move yet, or move
    it back (docs/faults.md). A request without a session hashes to a random replica."""
    if ext_proc.transport != "http":
        cluster = grpc_cluster(EXT_PROC_CLUSTER, ext_proc.addresses, health_checked=True)
        cluster.health_checks[0].grpc_health_check.service_name = DECISIONS_HEALTH_SERVICE
        _panic_only_when_none_healthy(cluster)
        # A replica that stops sends every stream for its sessions to retry on the next one at
        # once; Envoy's default of 3 retries in flight per cluster dropped the rest to the ring
        # fallback, unbound (tests/chaos/test_rolling_upgrade.py).
        cluster.circuit_breakers.CopyFrom(_generous_limits(max_retries=_MANY))
        if affinity_keys:
            cluster.lb_policy = cluster_pb2.Cluster.RING_HASH
            options = http_protocol_options_pb2.HttpProtocolOptions()
            cluster.typed_extension_protocol_options[_HTTP_OPTIONS].Unpack(options)
            options.hash_policy.extend(
                route_components_pb2.RouteAction.HashPolicy(
                    header=route_components_pb2.RouteAction.HashPolicy.Header(header_name=name))
                for name in affinity_keys)
            cluster.typed_extension_protocol_options[_HTTP_OPTIONS].CopyFrom(protos.pack(options))
        return cluster
    cluster = grpc_cluster(EXT_PROC_CLUSTER, ext_proc.addresses, health_checked=False)
    _panic_only_when_none_healthy(cluster)
    del cluster.typed_extension_protocol_options[_HTTP_OPTIONS]  # HTTP/1.1, Envoy's default
    cluster.health_checks.append(_health_check(
        http_health_check=health_check_pb2.HealthCheck.HttpHealthCheck(
            path=DECISIONS_HEALTH_PATH)
    ))
    # http_service has no retry policy: a replica that refuses connections is ejected at its
    # first failure, so only the requests already on their way fall back to Envoy's ring.
    cluster.outlier_detection.CopyFrom(outlier_detection_pb2.OutlierDetection(
        consecutive_5xx=protos.u32(1),
        consecutive_gateway_failure=protos.u32(1),
        interval=protos.duration(0.1),
        base_ejection_time=protos.duration(5.0),
        max_ejection_percent=protos.u32(100),
    ))
    return cluster


def _panic_only_when_none_healthy(cluster: cluster_pb2.Cluster) -> None:
    # Envoy's default (50 %) would send to every replica, degraded ones too, as soon as half of
    # them step aside; 1 % is "no healthy replica left" for any fleet of up to 100 replicas.
    cluster.common_lb_config.healthy_panic_threshold.CopyFrom(percent_pb2.Percent(value=1.0))


def grpc_cluster(
    name: str, addresses: Sequence[HostPort], *, health_checked: bool
) -> cluster_pb2.Cluster:
    """A cluster of gRPC servers over HTTP/2; hostnames are resolved (STRICT_DNS)."""
    options = http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions()
        )
    )
    all_ips = all(_is_ip(a.host) for a in addresses)
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC if all_ips else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=protos.duration(0.25),
        lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
        load_assignment=static_hosts(name, addresses),
        typed_extension_protocol_options={_HTTP_OPTIONS: protos.pack(options)},
        circuit_breakers=_generous_limits(),
    )
    if health_checked:
        cluster.health_checks.append(
            _health_check(grpc_health_check=health_check_pb2.HealthCheck.GrpcHealthCheck())
        )
    return cluster


_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _health_check(**kind: Any) -> health_check_pb2.HealthCheck:
    # Fast and unforgiving on purpose: a replica that steps aside (cut from etcd) must stop
    # taking decisions within a few hundred ms, since each one it takes meanwhile may place a
    # session its peers place elsewhere. A healthy replica that misses one check is ejected
    # for one interval at worst; its peers (or, with none left, panic mode) take its share.
    return health_check_pb2.HealthCheck(
        timeout=protos.duration(0.5),
        interval=protos.duration(0.25),
        # Envoy checks a cluster it sees no traffic on at this interval (60 s by default), and it
        # saw none on the ext_proc cluster: two checks in all over minutes of decisions.
        no_traffic_interval=protos.duration(0.25),
        unhealthy_threshold=protos.u32(1),
        healthy_threshold=protos.u32(1),
        **kind,
    )


def _generous_limits(max_retries: int | None = None) -> circuit_breaker_pb2.CircuitBreakers:
    thresholds = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections=protos.u32(_MANY),
        max_pending_requests=protos.u32(_MANY),
        max_requests=protos.u32(_MANY),
    )
    if max_retries is not None:
        thresholds.max_retries.CopyFrom(protos.u32(max_retries))
    return circuit_breaker_pb2.CircuitBreakers(thresholds=[thresholds])


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
