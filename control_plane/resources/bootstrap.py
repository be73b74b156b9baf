"""Envoy bootstraps: static (everything inline) for `kvgate envoy-config`."""

from __future__ import annotations

import json

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import base_pb2
from google.protobuf import json_format

from control_plane.resources import protos
from control_plane.resources.clusters import ext_proc_cluster, pool_cluster
from control_plane.resources.listener import gateway_listener
from control_plane.resources.names import RoutingMode
from control_plane.resources.routes import route_configuration
from kvgate.config.model import Config


def static_bootstrap(
    config: Config, node_id: str = "kvgate-gateway", mode: RoutingMode = RoutingMode.AFFINITY
) -> bootstrap_pb2.Bootstrap:
    """A self-contained bootstrap: the gateway listener, one cluster per pool, ext_proc."""
    affinity = mode is RoutingMode.AFFINITY
    return bootstrap_pb2.Bootstrap(
        node=base_pb2.Node(id=node_id, cluster="kvgate"),
        admin=bootstrap_pb2.Admin(address=protos.socket_address(config.envoy_admin)),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            listeners=[
                gateway_listener(config, routes=route_configuration(config, mode), mode=mode)
            ],
            clusters=[
                *(pool_cluster(pool, eds=False, mode=mode) for pool in config.pools),
                *([ext_proc_cluster(config.ext_proc)] if affinity else []),
            ],
        ),
    )


def to_json(bootstrap: bootstrap_pb2.Bootstrap) -> str:
    """JSON Envoy reads with `-c file.json` (also valid YAML)."""
    as_dict = json_format.MessageToDict(bootstrap, preserving_proto_field_name=True)
    return json.dumps(as_dict, indent=2, sort_keys=False) + "\n"
