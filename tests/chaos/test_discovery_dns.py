"""Engines found by DNS, under session traffic: a real DNS server (dnsmasq) whose records the
test changes, the real stack (etcd, control plane, ext_proc, Envoy), emulated engines on
127.0.0.x. Scale-out, scale-in and a DNS server that stops answering, in one run.

Targets (issue 44): a new engine gets its first new session within 2 resolution intervals (the
gateway timed itself, see PROBES below) and no existing session moves; a leaving engine's sessions
stay until its drain's deadline, then end on engines of its kv_pool, with no failed request; a
DNS server that does not answer removes no engine and fails no request.

    python -m pytest -m chaos tests/chaos/test_discovery_dns.py -s
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from kvgate.config.model import Config
from kvgate.etcd import EtcdClient
from tests.support.discovery_traffic import Traffic, arrival, drained, engine_records
from tests.support.dnsmasq import Dnsmasq, available
from tests.support.hosted_engines import HostedEngines
from tests.support.polling import eventually
from tests.support.stack import admin_json, gateway_config, running_stack

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600),
              pytest.mark.skipif(not available(), reason="dnsmasq is not installed "
                                 "(apt-get install dnsmasq-base)")]

EVERY = 1.0  # seconds between resolutions
# Scale-out: issue 44's target is that a new engine gets its first new session within 2
# resolution intervals of the DNS change: up to one until the control plane's next resolution
# (DNS adds no wait: dnsmasq's TTL is 0 and the resolver keeps no cache), one more for the
# leader's etcd write, ext_proc's endpoints mirror and Envoy's EDS push. The test holds the
# gateway to it with no margin, timing each step itself (a look every 20 ms; each time is an
# upper bound, late by up to a look's own time): the record in etcd, ext_proc's endpoints
# mirror at the record's revision, Envoy listing the engine among its hosts. It does not
# time it by a new session's answer: under the chaos tier's load (load average 9-10 on 2 cores)
# one round trip through Envoy, ext_proc and an engine took 0.3-1.9 s (2026-12-07), and with
# any new session 3 in 4 landed elsewhere by the hash's luck, each costing a round trip, which
# is how a 2 s measured that way flaked. New sessions show the gateway then places there:
# PROBES at a time, of ids Envoy's ring puts on the new engine, so each lands there once the
# gateway can place there, and every one sent from SETTLE_S after that must (the time Envoy's
# workers take the main thread's EDS update; tests/support/discovery_traffic.py).
PROBES = 4
DRAIN = 3.0  # seconds a leaving engine keeps its sessions
NAME = "engines.test"
SESSIONS = 24


@pytest.fixture
async def dnsmasq(tmp_path: Path) -> AsyncIterator[Dnsmasq]:
    server = Dnsmasq(tmp_path)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[HostedEngines]:
    async with HostedEngines(tmp_path / "engines") as hosted:
        yield hosted


async def test_dns_scale_out_scale_in_and_outage(tmp_path: Path, dnsmasq: Dnsmasq,
                                                 engines: HostedEngines, prefix: str) -> None:
    for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
        await engines.add(host)
    a2, a3, a4, static = (engines.address(f"127.0.0.{h}") for h in (2, 3, 4, 5))
    await dnsmasq.set({NAME: ["127.0.0.2", "127.0.0.3"]})
    # Beside the discovered engines (kv_pool kv-a), one from the file in another DDR pool: a
    # leaving engine's sessions must not end there.
    config = gateway_config(
        [{"address": static, "kv_pool": "kv-b"}], kv_pool="kv-a", prefix=prefix,
        placement={"load_gate": {"enabled": False}},
        pool_extra={"discover": {"dns": {"name": NAME, "port": engines.port,
                                         "every": f"{EVERY}s", "server": dnsmasq.server},
                                 "drain": f"{DRAIN}s", "misses": 3}})
    async with running_stack(config, tmp_path / "stack") as stack, \
            httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
        etcd = EtcdClient(stack.etcd_endpoints)
        try:
            await eventually(lambda: engine_records(etcd, prefix),
                             until=lambda r: {a2, a3} <= set(r),
                             what="the discovered engines' records")
            traffic = Traffic(http)
            sessions = [f"dev-{i}" for i in range(SESSIONS)]
            try:
                await traffic.start(sessions)
                homes = {s: traffic.engines_of(s)[0] for s in sessions}
                assert set(homes.values()) <= {a2, a3, static}
                await _scale_out(traffic, dnsmasq, etcd, config, homes, a4,
                                 [a2, a3, a4, static])
                await _flapping(traffic, dnsmasq, etcd, prefix, homes, a4)
                await _scale_in(traffic, dnsmasq, etcd, prefix, homes, a3, {a2, a4})
                admin = str(config.control_plane.admin)
                await _outage(traffic, dnsmasq, etcd, prefix, {a2, a4}, admin)
                listed = {e["address"]: e["source"]
                          for e in await admin_json(admin, "endpoints", "list")}
                assert listed == {a2: "dns", a4: "dns", static: "static"}
            finally:
                await traffic.close()
            assert traffic.failures == []
        finally:
            await etcd.close()


async def _scale_out(traffic: Traffic, dnsmasq: Dnsmasq, etcd: EtcdClient, config: Config,
                     homes: dict[str, str], new: str, pool: list[str]) -> None:
    async def change() -> float:
        return await dnsmasq.set({NAME: ["127.0.0.2", "127.0.0.3", "127.0.0.4"]})

    came = await arrival(traffic, new, change, etcd, config, pool, within=10 * EVERY,
                         probes=PROBES)
    print(f"scale-out: after the record changed, {came.summary()} (target: the gateway within "
          f"{2 * EVERY:g} s, 2 resolution intervals)")
    assert came.after_change()["gateway"] <= 2 * EVERY
    # Once the gateway could, it did: every new session sent from then on landed there.
    assert came.elsewhere(new) == []
    since = time.monotonic()
    await eventually(lambda: all(traffic.engines_of(s, since) for s in homes),
                     what="every session answered again")
    moved = {s: set(traffic.engines_of(s)) - {home} for s, home in homes.items()}
    assert {s: m for s, m in moved.items() if m} == {}


async def _flapping(traffic: Traffic, dnsmasq: Dnsmasq, etcd: EtcdClient, prefix: str,
                    homes: dict[str, str], flapping: str) -> None:
    """The new engine's record missing from about one resolution in three: never drained."""
    since = time.monotonic()
    for _ in range(4):
        await dnsmasq.set({NAME: ["127.0.0.2", "127.0.0.3"]})
        await asyncio.sleep(EVERY)  # missing for one interval (the schedule, not readiness)
        await dnsmasq.set({NAME: ["127.0.0.2", "127.0.0.3", "127.0.0.4"]})
        await asyncio.sleep(2 * EVERY)  # present for two
        record = (await engine_records(etcd, prefix))[flapping]
        assert record.left_at is None and record.drain_deadline is None
    moved = {s: set(traffic.engines_of(s, since)) - {home} for s, home in homes.items()}
    assert {s: m for s, m in moved.items() if m} == {}
    print(f"flapping: {flapping} missing about one resolution in three for "
          f"{time.monotonic() - since:.0f} s: not drained, 0 sessions moved")


async def _scale_in(traffic: Traffic, dnsmasq: Dnsmasq, etcd: EtcdClient, prefix: str,
                    homes: dict[str, str], leaving: str, siblings: set[str]) -> None:
    orphans = [s for s, home in homes.items() if home == leaving]
    assert orphans, homes
    await dnsmasq.set({NAME: ["127.0.0.2", "127.0.0.4"]})
    ends = await drained(traffic, etcd, prefix, leaving, orphans, siblings)
    assert set(ends.values()) <= siblings, ends
    print(f"scale-in: {len(orphans)} sessions of {leaving} moved to {sorted(set(ends.values()))}"
          f" after the drain; failures so far {len(traffic.failures)}")


async def _outage(traffic: Traffic, dnsmasq: Dnsmasq, etcd: EtcdClient, prefix: str,
                  serving: set[str], admin: str) -> None:
    before = await engine_records(etcd, prefix)
    failures = len(traffic.failures)
    dnsmasq.pause()
    try:
        answered = len(traffic.answers)
        # Several resolutions' worth (each fails after its own lifetime, about EVERY).
        await asyncio.sleep(6 * EVERY)  # the outage's length, not a wait for readiness
        (source,) = (await admin_json(admin, "status"))["discovery"]
        after = await engine_records(etcd, prefix)
        assert len(traffic.answers) > answered
    finally:
        dnsmasq.resume()
    print(f"DNS server stopped {6 * EVERY:g} s: status says {source}")
    assert source["error"] and source["age_s"] >= 4 * EVERY and source["engines"] == 2
    assert len(traffic.failures) == failures
    assert {a: r.state for a, r in after.items()} == {a: r.state for a, r in before.items()}
    assert serving <= set(after)
