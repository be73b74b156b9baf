"""Engines that register themselves (`kvgate register`, real processes) under session traffic,
against the real stack: a registered engine takes new sessions within a second and moves none;
one whose register stops is drained, its sessions move to its DDR pool after the drain, and no
request fails.

    python -m pytest -m chaos tests/chaos/test_registrations_under_traffic.py -s
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgate.discovery.registrations import registration_key
from kvgate.endpoints import EndpointRecord, EndpointRecords
from kvgate.etcd import EtcdClient
from kvgate.runtime.children.child import Child
from tests.conftest import EtcdServer
from tests.support.discovery_traffic import Traffic, first_new_session_on
from tests.support.fault_proxy import FaultProxy
from tests.support.hosted_engines import HostedEngines
from tests.support.polling import eventually
from tests.support.stack import gateway_config, running_stack

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

DRAIN = 2.0
SESSIONS = 12


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[HostedEngines]:
    hosted = HostedEngines(tmp_path / "engines")
    await hosted.start()
    yield hosted
    await hosted.stop()


async def _records(client: EtcdClient, prefix: str) -> dict[str, EndpointRecord]:
    return {r.address: r for r in await EndpointRecords(client, prefix).list("coder")}


async def _partition(traffic: Traffic, proxy: FaultProxy, etcd: EtcdClient, prefix: str,
                     admin: str, engines: set[str], sessions: list[str], home: str) -> None:
    """etcd cut off from the control plane (connections reset) for longer than the engines'
    lease TTL: no engine removed, no request failed, no session moved; status shows the age."""
    failures = len(traffic.failures)
    since = time.monotonic()
    proxy.cut(reset=True)
    try:
        await asyncio.sleep(8.0)  # the partition's length, not a wait for readiness
        status = await _cli(admin, "status")
    finally:
        proxy.heal()
    (source,) = status["discovery"]
    print(f"etcd cut off from the control plane 8 s: status says {source}")
    assert source["error"] and source["age_s"] >= 5.0 and source["engines"] == 2
    records = await eventually(lambda: _records(etcd, prefix), what="records")
    assert set(records) == engines and all(r.left_at is None for r in records.values())
    assert len(traffic.failures) == failures
    assert {e for s in sessions for e in traffic.engines_of(s, since)} == {home}
    await eventually(lambda: _cli(admin, "status"), until=lambda st: not st["discovery"][0][
        "error"] and st["leader"] is not None, what="the control plane back with etcd")


async def _cli(admin: str, *args: str) -> Any:
    """`kvgate ... --json` against the control plane's admin API (read-only: no token)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", *args, "--json", "--admin", admin,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    return json.loads(out)


def _register(workdir: Path, etcd: list[str], prefix: str, engine: str) -> Child:
    name = f"register-{engine.replace(':', '-')}"
    return Child(name, [sys.executable, "-m", "kvgate_cli", "register", "--pool", "coder",
                        "--engine", f"http://{engine}", "--ttl", "5s",
                        "--etcd", ",".join(etcd), "--prefix", prefix],
                 workdir / f"{name}.log")


async def test_registered_engines_come_and_go(tmp_path: Path, engines: HostedEngines,
                                              prefix: str, etcd: EtcdServer) -> None:
    a, b = await engines.add("127.0.0.2"), await engines.add("127.0.0.3")
    config = gateway_config([], kv_pool="kv-a", prefix=prefix, etcd=[etcd.endpoint],
                            placement={"load_gate": {"enabled": False}},
                            pool_extra={"discover": {"etcd": {}, "drain": f"{DRAIN}s"}})
    # The control plane reaches etcd through a proxy the test cuts (a partition); the engines'
    # registers, ext_proc and the test reach it directly.
    async with FaultProxy(etcd.endpoint) as proxy, \
            running_stack(config, tmp_path / "stack",
                          etcd_for={"control-plane": [proxy.address]}) as stack, \
            httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
        await _scenario(tmp_path, stack.etcd_endpoints, prefix, http, proxy,
                        str(config.control_plane.admin), a, b)


async def _scenario(tmp_path: Path, endpoints: list[str], prefix: str, http: httpx.AsyncClient,
                    proxy: FaultProxy, admin: str, a: str, b: str) -> None:
    etcd = EtcdClient(endpoints)
    first = _register(tmp_path, endpoints, prefix, a)
    second = _register(tmp_path, endpoints, prefix, b)
    traffic = Traffic(http)
    talkers: list[asyncio.Task[None]] = []
    try:
        await first.start()
        await eventually(lambda: _records(etcd, prefix), until=lambda r: a in r,
                         what="the first registration's record")
        sessions = [f"dev-{i}" for i in range(SESSIONS)]
        talkers = [asyncio.create_task(traffic.talk(s)) for s in sessions]
        await eventually(lambda: {s for _, s, _ in traffic.answers} == set(sessions),
                         what="every session answered")
        assert {e for _, _, e in traffic.answers} == {a}

        async def register() -> float:
            await second.start()
            key = registration_key(prefix, "coder", b)
            await eventually(lambda: etcd.get(key), every=0.02, what="b's registration")
            return time.monotonic()

        # From when etcd is seen holding it: up to one look (20 ms) after the put.
        took = await first_new_session_on(traffic, b, register, within=10.0)
        assert took is not None
        print(f"registration: the first new session on the new engine was placed "
              f"{took[0]:.2f}..{took[1]:.2f} s after etcd held its registration (target: 1 s)")
        assert took[1] <= 1.0
        assert {e for s in sessions for e in traffic.engines_of(s)} == {a}  # none moved
        await _partition(traffic, proxy, etcd, prefix, admin, {a, b}, sessions, a)
        # b takes sessions of its own, then its register stops: drained, then removed.
        own = [f"b-{i}" for i in range(40)]
        homes = {s: await traffic.ask(s, 0) for s in own}
        mine = [s for s, home in homes.items() if home == b]
        assert mine
        talkers += [asyncio.create_task(traffic.talk(s)) for s in mine]
        await second.stop()
        record = await eventually(lambda: _records(etcd, prefix),
                                  until=lambda r: r[b].drain_deadline is not None,
                                  what=f"{b} draining")
        deadline = record[b].drain_deadline
        assert deadline is not None
        deadline_mono = time.monotonic() + (deadline - time.time())
        await eventually(lambda: _records(etcd, prefix), until=lambda r: b not in r,
                         what=f"{b}'s record removed")
        since = time.monotonic()
        # Answers in flight when the record went may still come from b: the sessions end
        # on a.
        await eventually(lambda: all(traffic.engines_of(s, since)[-1:] == [a] for s in mine),
                         what="b's sessions ending on a after the drain")
        early = [(t, s, e) for t, s, e in traffic.answers
                 if s in mine and e != b and t < deadline_mono - 0.2]
        assert early == [], "a session moved before its drain's deadline"
    finally:
        traffic.stop.set()
        await asyncio.gather(*talkers)
        await first.stop()
        await second.stop()
        await etcd.close()
    assert traffic.failures == []
