"""Bindings through etcd: an etcd outage loses nothing; racing replicas agree."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from kvgate.etcd import EtcdClient
from kvgate.session import normalize_session
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.stack import gateway_config, running_stack


async def _route(http: httpx.AsyncClient, session: str) -> str:
    reply = await http.get("/v1/chat", headers={"x-session-id": session})
    assert reply.status_code == 200, reply.text
    return reply.json()["upstream"]


async def _bindings(endpoint: str, prefix: str) -> dict[str, str]:
    client = EtcdClient([endpoint])
    try:
        kvs, _ = await client.get_prefix(f"{prefix}bindings/".encode())
    finally:
        await client.close()
    return {kv.key.decode(): json.loads(kv.value)["endpoint"] for kv in kvs}


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_etcd_outage_keeps_routing_and_writes_back_later(
    tmp_path: Path, upstreams, etcd, prefix: str, transport: str
) -> None:
    ups = await upstreams(3)
    config = gateway_config([u.address for u in ups], prefix=prefix, etcd=[etcd.endpoint],
                            transport=transport)
    known = [f"known-{i}" for i in range(10)]
    fresh = [f"fresh-{i}" for i in range(10)]
    async with running_stack(config, tmp_path / "stack"):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            homes = {s: await _route(http, s) for s in known}
            await etcd.stop()
            for _ in range(3):
                for session in known:
                    assert await _route(http, session) == homes[session]
            for session in fresh:
                homes[session] = await _route(http, session)
            for session in fresh:  # placed while etcd was away, and sticky all the same
                assert await _route(http, session) == homes[session]
            await etcd.start()
            stored = await eventually(lambda: _bindings(etcd.endpoint, prefix),
                                      until=lambda stored: len(stored) >= len(homes),
                                      what="bindings written back to etcd")
            for session in known + fresh:
                assert await _route(http, session) == homes[session]
    by_session = {key.rsplit("/", 1)[1]: value for key, value in stored.items()}
    assert len(stored) == len(homes)  # nothing duplicated
    assert {normalize_session(s.encode()): h for s, h in homes.items()} == by_session


async def test_two_gateways_racing_on_new_sessions_agree(
    tmp_path: Path, upstreams, etcd, prefix: str
) -> None:
    ups = await upstreams(4)
    endpoints = [u.address for u in ups]
    # Different load bounds make the two replicas' own choices differ; etcd must arbitrate.
    first = gateway_config(endpoints, prefix=prefix, etcd=[etcd.endpoint], load_factor=1.0)
    second = gateway_config(endpoints, prefix=prefix, etcd=[etcd.endpoint], load_factor=4.0)
    second = replace(second, control_plane=replace(
        second.control_plane, admin=replace(second.control_plane.admin, port=free_port())
    ))
    sessions = [f"race-{i}" for i in range(40)]
    async with running_stack(first, tmp_path / "a"), running_stack(second, tmp_path / "b"):
        async with (
            httpx.AsyncClient(base_url=f"http://{first.listener}", timeout=30) as a,
            httpx.AsyncClient(base_url=f"http://{second.listener}", timeout=30) as b,
        ):
            racing = await asyncio.gather(
                *(_route(client, s) for s in sessions for client in (a, b))
            )
            pairs = {s: (racing[2 * i], racing[2 * i + 1]) for i, s in enumerate(sessions)}
            later = {s: (await _route(a, s), await _route(b, s)) for s in sessions}
    stored = await _bindings(etcd.endpoint, prefix)
    assert len(stored) == len(sessions)
    for session in sessions:
        home_a, home_b = later[session]
        assert home_a == home_b, (session, pairs[session], later[session])
    agreed_at_once = sum(x == y for x, y in pairs.values())
    assert agreed_at_once == len(sessions), pairs
