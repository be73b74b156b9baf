"""Probes that cannot be trusted must not fail a pool: a stalled control-plane event loop is not
a dead fleet, and probes never fail more than health.max_failed_fraction of a pool."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from control_plane.health import HealthChecker
from kvgate.config import load_text
from kvgate.endpoints import EndpointRecords
from kvgate.endpoints.membership import sync_membership
from kvgate.etcd import EtcdClient
from kvgate.runtime.tasks.supervisor import Supervisor
from tests.admin.admin_helpers import run_cli
from tests.support.polling import eventually
from tests.support.stack import FAST_HEALTH, gateway_config, running_stack
from tests.support.upstreams import Upstream


async def _states(etcd: list[str], prefix: str) -> dict[str, str]:
    client = EtcdClient(etcd)
    try:
        return {r.address: r.state for r in await EndpointRecords(client, prefix).list()}
    finally:
        await client.close()


async def test_a_stalled_event_loop_is_not_mistaken_for_dead_engines(
    upstreams, etcd, prefix: str
) -> None:
    engines: list[Upstream] = await upstreams(4)
    config = load_text(yaml.safe_dump({
        "etcd": {"endpoints": [etcd.endpoint], "prefix": prefix},
        "pools": [{"name": "coder", "endpoints": [e.address for e in engines],
                   "health": {"interval": "100ms", "timeout": "50ms",
                              "unhealthy_threshold": 2, "healthy_threshold": 1}}],
    }))
    client = EtcdClient([etcd.endpoint])
    await sync_membership(client, config, "test", claim=True)
    supervisor = Supervisor("control_plane", CollectorRegistry())
    checker = HealthChecker(config, client, supervisor)
    stop = asyncio.Event()

    async def hog() -> None:  # a control plane busy with other work: 300 ms blocks, back to back
        while not stop.is_set():
            time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point
            await asyncio.sleep(0.005)

    await checker.start()
    hogging = asyncio.create_task(hog())
    try:
        # Every engine probed many times over while the loop was blocked (and every probe in
        # time answered): more than enough failures in a row to fail each of them.
        await eventually(lambda: min(e.probes for e in engines) >= 8, within=60)
    finally:
        stop.set()
        await hogging
    try:
        assert await _states([etcd.endpoint], prefix) == {e.address: "active" for e in engines}
        assert checker.healthy == {("coder", e.address): True for e in engines}
    finally:
        await checker.stop()
        await client.close()


async def test_probes_fail_at_most_max_failed_fraction_of_a_pool(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    engines: list[Upstream] = await upstreams(4)
    config = gateway_config([e.address for e in engines], prefix=prefix)
    assert config.pools[0].health.max_failed_fraction == 0.5
    async with running_stack(config, tmp_path / "stack") as stack:
        etcd = stack.etcd_endpoints
        await eventually(lambda: all(e.probes for e in engines), within=20)
        for engine in engines[:3]:
            await engine.stop()
        dead = {e.address for e in engines[:3]}

        async def failed() -> set[str]:
            return {a for a, s in (await _states(etcd, prefix)).items() if s == "failed"}

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(await failed()) < 2:
            assert loop.time() < deadline, await _states(etcd, prefix)
            await asyncio.sleep(0.1)
        log = stack.workdir / "control-plane.log"
        while "health_guard_holding" not in log.read_text():
            assert loop.time() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.1)
        # The third dead engine is held: probes keep calling it dead, it stays active.
        probed = engines[3].probes
        await eventually(lambda: engines[3].probes >= probed + 10, within=20)
        states = await _states(etcd, prefix)
        assert sorted(states.values()) == ["active", "active", "failed", "failed"], states
        assert await failed() <= dead
        assert states[engines[3].address] == "active"
        # One failed engine comes back: the held one may now be failed in its place.
        revived = next(e for e in engines[:3] if states[e.address] == "failed")
        await revived.start()
        held = (dead - await failed()).pop()
        deadline = loop.time() + 20
        while (states := await _states(etcd, prefix))[held] != "failed" \
                or states[revived.address] != "active":
            assert loop.time() < deadline, states
            await asyncio.sleep(0.1)
        assert sorted(states.values()) == ["active", "active", "failed", "failed"], states


async def test_status_shows_a_held_engine_failing_its_probes_and_why_it_is_routed_to(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    """`kvgate up --engines http://127.0.0.1:1`: one engine, nothing listening. The guard keeps
    a pool of one active (max_failed_fraction 0.5 allows 0 failed); `kvgate endpoints list` and
    `kvgate status` say its probes fail and why it still gets traffic."""
    dead: Upstream = (await upstreams(1))[0]
    await dead.stop()
    config = gateway_config([dead.address], prefix=prefix, health=FAST_HEALTH)
    async with running_stack(config, tmp_path / "stack") as stack:
        admin = str(config.control_plane.admin)
        log = stack.workdir / "control-plane.log"
        await eventually(lambda: "health_guard_holding" in log.read_text(), within=30)

        listed = await run_cli("endpoints", "list", "--json", admin=admin)
        assert listed.code == 0, listed.err
        (shown,) = json.loads(listed.out)
        assert shown["state"] == "active" and shown["healthy"] is False, shown
        assert "health guard" in shown["held"] and "max_failed_fraction 0.5 allows 0" in (
            shown["held"]), shown
        table = await run_cli("endpoints", "list", admin=admin)
        assert "FAILING PROBES, still routed to: the health guard keeps it active" in table.out
        status = await run_cli("status", admin=admin)
        assert "FAILING PROBES" in status.out, status.out
        (in_status,) = json.loads((await run_cli("status", "--json", admin=admin)).out)[
            "endpoints"]
        assert in_status["healthy"] is False and in_status["held"] == shown["held"]
