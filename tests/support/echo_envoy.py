"""A real Envoy running only kvgate's body-session filters, answering every request with what
they found: the implicit key as the body, the body fields found in `x-found-fields`, the
carried session key (x-kvgate-session-key) in `x-found-key`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from google.protobuf import json_format

from control_plane.resources import protos
from control_plane.resources.session_filters import body_session_filters, buffer_limit
from kvgate.config.model import HostPort, Session
from kvgate.runtime.children.envoy import envoy_child, envoy_ready
from kvgate.session import BODY_METADATA_NAMESPACE, IMPLICIT_KEY, SESSION_KEY_HEADER
from tests.support.ports import free_ports

_ECHO = r"""
function envoy_on_request(handle)
  handle:body() -- answer once the request is in, as an upstream would
  local found = handle:streamInfo():dynamicMetadata():get("NAMESPACE")
  local fields, implicit = {}, ""
  if found ~= nil then
    for key, value in pairs(found) do
      if key == "IMPLICIT" then
        implicit = value
      else  -- bytes a header cannot hold as decimal escapes (\010)
        local shown = string.gsub(value, "[%c\128-\255]",
                                  function(c) return string.format("\\%03d", c:byte()) end)
        fields[#fields + 1] = key .. "=" .. shown
      end
    end
  end
  table.sort(fields)
  handle:respond({[":status"] = "200", ["x-found-fields"] = table.concat(fields, ","),
                  ["x-found-key"] = handle:headers():get("KEY_HEADER") or ""}, implicit)
end
""".replace("NAMESPACE", BODY_METADATA_NAMESPACE).replace("IMPLICIT", IMPLICIT_KEY).replace(
    "KEY_HEADER", SESSION_KEY_HEADER)


def _bootstrap(session: Session, listener: HostPort, admin: HostPort) -> bootstrap_pb2.Bootstrap:
    echo = lua_pb2.Lua(default_source_code=base_pb2.DataSource(inline_string=_ECHO))
    manager = hcm.HttpConnectionManager(
        stat_prefix="echo",
        route_config=route_pb2.RouteConfiguration(virtual_hosts=[route_components_pb2.VirtualHost(
            name="all", domains=["*"], routes=[route_components_pb2.Route(
                match=route_components_pb2.RouteMatch(prefix="/"),
                direct_response=route_components_pb2.DirectResponseAction(status=404),
            )],
        )]),
        http_filters=[
            *body_session_filters(session),
            hcm.HttpFilter(name="echo", typed_config=protos.pack(echo)),
            hcm.HttpFilter(name="envoy.filters.http.router",
                           typed_config=protos.pack(router_pb2.Router())),
        ],
    )
    return bootstrap_pb2.Bootstrap(
        admin=bootstrap_pb2.Admin(address=protos.socket_address(admin)),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(listeners=[
            listener_pb2.Listener(
                name="echo", address=protos.socket_address(listener),
                per_connection_buffer_limit_bytes=protos.u32(buffer_limit(session)),
                filter_chains=[listener_components_pb2.FilterChain(filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=protos.pack(manager),
                    )
                ])],
            )
        ]),
    )


def _write(bootstrap: bootstrap_pb2.Bootstrap, workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "echo-envoy.json"
    as_dict = json_format.MessageToDict(bootstrap, preserving_proto_field_name=True)
    path.write_text(json.dumps(as_dict))
    return path


@asynccontextmanager
async def echo_envoy(session: Session, workdir: Path) -> AsyncIterator[str]:
    """Yields the base URL of an Envoy running `session`'s body filters and the echo."""
    port, admin_port = free_ports(2)
    listener, admin = HostPort("127.0.0.1", port), HostPort("127.0.0.1", admin_port)
    config = _write(_bootstrap(session, listener, admin), workdir)
    child = envoy_child(config, workdir / "echo-envoy.log", concurrency=1)
    await child.start()
    try:
        await child.wait_ready(lambda: envoy_ready(admin), 30)
        yield f"http://{listener}"
    finally:
        await child.stop()
