"""Envoy bootstraps: static (everything inline), or ADS (everything from the control plane)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2
from google.protobuf import json_format

from control_plane.resources import protos
from control_plane.resources.affinity import affinity_keys
from control_plane.resources.clusters import ext_proc_cluster, grpc_cluster, pool_cluster
from control_plane.resources.listener import gateway_listener
from control_plane.resources.routes import route_configuration
from kvgate.config.model import Config, HostPort
from kvgate.contract.envoy import XDS_CLUSTER
from kvgate.contract.modes import RoutingMode


def static_bootstrap(
    config: Config, node_id: str = "kvgate-gateway", mode: RoutingMode = RoutingMode.AFFINITY
) -> bootstrap_pb2.Bootstrap:
    """A self-contained bootstrap: the gateway listener, one cluster per pool, ext_proc."""
    asks_ext_proc = mode.uses_ext_proc
    return bootstrap_pb2.Bootstrap(
        node=base_pb2.Node(id=node_id, cluster="kvgate"),
        admin=bootstrap_pb2.Admin(address=protos.socket_address(config.envoy_admin)),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            listeners=[
                gateway_listener(config, routes=route_configuration(config, mode), mode=mode)
            ],
            clusters=[
                *(pool_cluster(pool, eds=False, mode=mode) for pool in config.pools),
                *([ext_proc_cluster(config.ext_proc, affinity_keys(config.session))]
                  if asks_ext_proc else []),
            ],
        ),
    )


def ads_bootstrap(
    config: Config, node_id: str = "kvgate-gateway", xds: Sequence[HostPort] | None = None
) -> bootstrap_pb2.Bootstrap:
    """A bootstrap that takes everything else over ADS from the control plane replicas."""
    targets = list(xds or [config.control_plane.xds])
    return bootstrap_pb2.Bootstrap(
        node=base_pb2.Node(id=node_id, cluster="kvgate"),
        admin=bootstrap_pb2.Admin(address=protos.socket_address(config.envoy_admin)),
        dynamic_resources=bootstrap_pb2.Bootstrap.DynamicResources(
            ads_config=config_source_pb2.ApiConfigSource(
                api_type=config_source_pb2.ApiConfigSource.GRPC,
                transport_api_version=config_source_pb2.V3,
                grpc_services=[grpc_service_pb2.GrpcService(
                    envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=XDS_CLUSTER)
                )],
                set_node_on_first_message_only=True,
            ),
            cds_config=_ads_source(),
            lds_config=_ads_source(),
        ),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            clusters=[grpc_cluster(XDS_CLUSTER, targets, health_checked=False)]
        ),
    )


def _ads_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(), resource_api_version=config_source_pb2.V3
    )


def to_json(bootstrap: bootstrap_pb2.Bootstrap) -> str:
    """JSON Envoy reads with `-c file.json` (also valid YAML)."""
    as_dict = json_format.MessageToDict(bootstrap, preserving_proto_field_name=True)
    return json.dumps(as_dict, indent=2, sort_keys=False) + "\n"
