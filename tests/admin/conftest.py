"""Admin API fixtures: a seeded etcd and in-process AdminServers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from control_plane.admin.server import AdminServer, ServerTls
from control_plane.operations import Operations
from kvgate.config import HostPort
from kvgate.endpoints import sync_membership
from kvgate.etcd import EtcdClient
from tests.admin.admin_helpers import (
    SESSION_A,
    SESSION_B,
    SESSION_C,
    Fleet,
    StartServer,
    config_for,
    fake_loads,
    fake_status,
)


@pytest.fixture
async def fleet(etcd: object, prefix: str) -> AsyncIterator[Fleet]:
    endpoint: str = etcd.endpoint  # type: ignore[attr-defined]
    client = EtcdClient([endpoint])
    config = config_for(endpoint, prefix)
    await sync_membership(client, config, "test", claim=True)
    for pool, session, target in (("coder", SESSION_A, "10.0.0.11:8000"),
                                  ("coder", SESSION_B, "10.0.0.11:8000"),
                                  ("chat", SESSION_C, "10.0.1.1:8000")):
        await client.put(f"{prefix}bindings/{pool}/{session}".encode(),
                         f'{{"endpoint": "{target}"}}'.encode())
    yield Fleet(client, config, prefix, endpoint)
    await client.close()


@pytest.fixture
async def admin_server(fleet: Fleet) -> AsyncIterator[StartServer]:
    started: list[AdminServer] = []

    async def start(host: str = "127.0.0.1", token: str | None = None,
                    tls: ServerTls | None = None, read_token: str | None = None) -> AdminServer:
        ops = Operations(fleet.client, fleet.prefix, loads=fake_loads)
        server = AdminServer(ops, fake_status, HostPort(host, 0), token, tls=tls,
                             read_token=read_token)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop(0)
