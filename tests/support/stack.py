"""Build configs on free loopback ports and run the real stack (etcd, ext_proc, Envoy); read
what it stores and what its admin API says."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from kvgate.config import Config, load_text
from kvgate.config.model import HostPort
from kvgate.etcd import EtcdClient
from stack.local import Stack
from tests.support.ports import free_ports

# Health settings for tests that are not about health: a probe may take up to 2 s and it takes
# three misses in a row to fail an engine, so a CPU-starved control plane or engine is never
# failed because the machine is slow. Engines start healthy, so long intervals delay nothing.
CALM_HEALTH: dict[str, object] = {
    "interval": "2s", "timeout": "2s", "unhealthy_threshold": 3, "healthy_threshold": 1,
}
# For tests of failure detection: a dead engine (connection refused) is failed after two probes,
# within about 2 s; a live one would have to miss two 1 s probes in a row.
FAST_HEALTH: dict[str, object] = {
    "interval": "1s", "timeout": "1s", "unhealthy_threshold": 2, "healthy_threshold": 1,
}


def gateway_config(
    endpoints: Sequence[str | dict[str, object]],
    *,
    ext_procs: int = 1,
    etcd: Sequence[str] | None = None,
    prefix: str = "/kvgate/test/",
    idle_ttl: str = "1h",
    load_factor: float = 1.25,
    kv_pool: str = "kv-a",
    message_timeout: str = "5s",
    health: dict[str, object] | None = None,
    default_routes: bool = False,
    session: dict[str, object] | None = None,
    transport: str = "grpc",
    placement: dict[str, object] | None = None,
    extra: dict[str, object] | None = None,
    pool_extra: dict[str, object] | None = None,
) -> Config:
    """A one-pool config on free ports. Every path goes to the pool, unless `default_routes`:
    then no `routes:` key, so the gateway serves only the inference API. `message_timeout`
    (Envoy's wait for ext_proc) is generous: past it Envoy falls back to its ring and a slow
    ext_proc would look like a moved session. `health` defaults to :data:`CALM_HEALTH`.
    `session`: extra `session:` keys (body_fields, implicit, body_limit). `transport`:
    ext_proc.transport (grpc or http). `placement`: extra `placement:` keys (load_gate, ...).
    `extra`: more top-level keys (max_request_bytes, ...); `pool_extra`: more keys of the pool
    (discover, ...)."""
    ports = iter(free_ports(5 + ext_procs))
    data: dict[str, object] = {
        "listener": {"address": "127.0.0.1", "port": next(ports)},
        "envoy_admin": {"address": "127.0.0.1", "port": next(ports)},
        "control_plane": {
            "xds": f"127.0.0.1:{next(ports)}", "admin": f"127.0.0.1:{next(ports)}",
        },
        "ext_proc": {
            "address": [f"127.0.0.1:{next(ports)}" for _ in range(ext_procs)],
            "metrics": f"127.0.0.1:{next(ports)}",
            "message_timeout": message_timeout,
            "transport": transport,
        },
        "etcd": {"prefix": prefix, **({"endpoints": list(etcd)} if etcd else {})},
        "session": {"headers": ["x-session-id"], "idle_ttl": idle_ttl, **(session or {})},
        "placement": {"load_factor": load_factor, **(placement or {})},
        "pools": [{
            "name": "coder", "kv_pool": kv_pool, "endpoints": list(endpoints),
            "health": dict(CALM_HEALTH if health is None else health), **(pool_extra or {}),
        }],
        "routes": [{"match": {"prefix": "/"}, "pool": "coder"}],
    }
    data.update(extra or {})
    if default_routes:
        del data["routes"]
    return load_text(yaml.safe_dump(data))


@asynccontextmanager
async def running_stack(config: Config, workdir: Path,
                        etcd_for: dict[str, list[str]] | None = None,
                        envoy_xds: HostPort | None = None,
                        envoy_base_id: int | None = None,
                        env_for: dict[str, dict[str, str]] | None = None
                        ) -> AsyncIterator[Stack]:
    """``etcd_for``: endpoints one component uses instead of the cluster's (Stack.etcd_for);
    ``env_for``: environment one component gets on top of this process's (Stack.env_for);
    ``envoy_xds``: where Envoy asks for its config (Stack.envoy_xds); ``envoy_base_id``: Envoy's
    hot restart on (Stack.hot_restart_envoy)."""
    stack = Stack(config, workdir, ready_timeout=60,  # generous: the machine may be busy
                  etcd_for=etcd_for or {}, envoy_xds=envoy_xds, envoy_base_id=envoy_base_id,
                  env_for=env_for or {})
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()


async def stored_bindings(etcd: Sequence[str], prefix: str) -> dict[str, str]:
    """Every binding etcd holds under ``prefix``: session uuid -> endpoint."""
    return {session: value["endpoint"]
            for session, value in (await stored_binding_values(etcd, prefix)).items()}


async def stored_binding_values(etcd: Sequence[str], prefix: str) -> dict[str, dict[str, Any]]:
    """Every binding etcd holds under ``prefix``: session uuid -> its stored value (endpoint,
    and a moved one's `reason` and `moved_at`)."""
    client = EtcdClient(list(etcd))
    try:
        kvs, _ = await client.get_prefix(f"{prefix}bindings/".encode())
    finally:
        await client.close()
    return {kv.key.decode().rsplit("/", 1)[1]: json.loads(kv.value) for kv in kvs}


async def admin_json(admin: str, *args: str) -> Any:
    """`kvgate ARGS --json` against the control plane's admin API (read-only: no token)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", *args, "--json", "--admin", admin,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    return json.loads(out)
