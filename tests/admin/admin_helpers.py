"""Admin API test helpers: a small fleet's config, fake providers, the CLI as a child process."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from control_plane.admin.server import AdminServer
from control_plane.operations import EndpointLoad
from control_plane.status import ControlPlaneStatus, NodeStatus
from kvgate.config import Config, load_text
from kvgate.etcd import EtcdClient
from kvgate.session import normalize_session

SESSION_A = str(uuid.UUID(int=0xA))
SESSION_B = str(uuid.UUID(int=0xB))
SESSION_C_RAW = "user-42"  # not a UUID: bound under its UUIDv5
SESSION_C = normalize_session(SESSION_C_RAW.encode())

LISTENER_V3 = "type.googleapis.com/envoy.config.listener.v3.Listener"


def config_for(etcd_endpoint: str, prefix: str) -> Config:
    return load_text(f"""
etcd: {{endpoints: ["{etcd_endpoint}"], prefix: "{prefix}"}}
pools:
  - name: coder
    kv_pool: memcache-a
    endpoints:
      - 10.0.0.11:8000
      - 10.0.0.12:8000
      - {{address: 10.0.0.13:8000, kv_pool: memcache-b}}
  - name: chat
    kv_pool: memcache-c
    endpoints:
      - {{address: 10.0.1.1:8000, role: decode}}
      - {{address: 10.0.1.2:8000, role: prefill}}
routes:
  - match: {{prefix: /chat/}}
    pool: chat
  - match: {{prefix: /}}
    pool: coder
""")


def fake_status() -> ControlPlaneStatus:
    return ControlPlaneStatus(
        identity="cp-1", leader="cp-1", config_version="v7", config_source="/etc/kvgate.yaml",
        nodes=(NodeStatus("envoy-a", "kvgate", 1_700_000_000.0, {LISTENER_V3: "v7"}, nacks=2,
                          last_nack="bad listener", last_nack_version="v6"),),
    )


def fake_loads(address: str) -> EndpointLoad:
    if address == "10.0.0.11:8000":
        return EndpointLoad(running=3, waiting=1, kv_cache_usage=0.5, hit_rate=0.25)
    return EndpointLoad()


@dataclass
class Fleet:
    client: EtcdClient
    config: Config
    prefix: str
    etcd_endpoint: str


StartServer = Callable[..., Awaitable[AdminServer]]


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


async def run_cli(*args: str, admin: str, env: dict[str, str] | None = None) -> Result:
    """`python -m kvgate_cli ...` as a child (async: the in-process server keeps serving)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    environment.update({"KVGATE_ADMIN": admin, **(env or {})})
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", *args, env=environment,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode is not None
    return Result(child.returncode, out.decode(), err.decode())
