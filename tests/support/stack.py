"""Build configs on free loopback ports and run the real stack (etcd, ext_proc, Envoy)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import yaml

from kvgate.config import Config, load_text
from kvgate.runtime.ports import free_ports
from kvgate.up.stack import Stack


def gateway_config(
    endpoints: Sequence[str | dict[str, object]],
    *,
    ext_procs: int = 1,
    etcd: Sequence[str] | None = None,
    prefix: str = "/kvgate/test/",
    idle_ttl: str = "1h",
    load_factor: float = 1.25,
    kv_pool: str = "kv-a",
    message_timeout: str = "200ms",
    session: dict[str, object] | None = None,
) -> Config:
    """`session`: extra `session:` keys (body_fields, implicit, body_limit)."""
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
        },
        "etcd": {"prefix": prefix, **({"endpoints": list(etcd)} if etcd else {})},
        "session": {"headers": ["x-session-id"], "idle_ttl": idle_ttl, **(session or {})},
        "placement": {"load_factor": load_factor},
        "pools": [{
            "name": "coder", "kv_pool": kv_pool, "endpoints": list(endpoints),
            "health": {"interval": "200ms", "timeout": "150ms", "unhealthy_threshold": 2,
                       "healthy_threshold": 1},
        }],
        "routes": [{"match": {"prefix": "/"}, "pool": "coder"}],
    }
    return load_text(yaml.safe_dump(data))


@asynccontextmanager
async def running_stack(config: Config, workdir: Path) -> AsyncIterator[Stack]:
    stack = Stack(config, workdir)
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()
