"""Engines dying and draining under session traffic, on emulated engines sharing a DDR pool."""

from __future__ import annotations

import asyncio
import math
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.operations import Operations
from kvgate.etcd import EtcdClient
from kvgate.session import normalize_session
from tests.support.fleet import EngineProcesses
from tests.support.polling import eventually
from tests.support.stack import FAST_HEALTH, gateway_config, running_stack, stored_bindings

CODE = "".join(f"def handler_{i}(event):\n    return event.get('k{i}')\n" for i in range(60))


def _chat(turn: int, session: str = "") -> dict[str, object]:
    # Each session has its own code context, so its KV blocks are its own.
    return {
        "messages": [
            {"role": "system", "content": f"# repository of {session}\n" + CODE},
            {"role": "user", "content": f"Question {turn}: what does handler_{turn} do?"},
        ],
        "max_tokens": 4,
    }


async def _external_hits(http: httpx.AsyncClient, engine: str) -> float:
    text = (await http.get(f"http://{engine}/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:external_prefix_cache_hits":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


async def _set_of(probe: Callable[[str], Awaitable[str]], sessions: list[str]) -> set[str]:
    return {await probe(s) for s in sessions}


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[EngineProcesses]:
    engines = EngineProcesses(4, tmp_path / "fleet")
    await engines.start()
    yield engines
    await engines.stop()


async def test_engine_killed_under_traffic(tmp_path: Path, fleet: EngineProcesses, prefix: str):
    config = gateway_config(fleet.engines, prefix=prefix, kv_pool="memcache-a",
                            health=FAST_HEALTH)
    sessions = [f"dev-{i}" for i in range(12)]
    async with running_stack(config, tmp_path / "stack") as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            homes = {}
            for s in sessions:
                reply = await http.post("/v1/chat/completions", json=_chat(0, s),
                                        headers={"x-session-id": s})
                assert reply.status_code == 200
                homes[s] = reply.headers["x-engine-id"]
            victim = max(set(homes.values()), key=list(homes.values()).count)
            orphans = [s for s, home in homes.items() if home == victim]
            failures: list[str] = []
            answered: list[str] = []
            stop = asyncio.Event()

            async def talk(session: str) -> None:
                turn = 1
                while not stop.is_set():
                    reply = await http.post("/v1/chat/completions", json=_chat(turn, session),
                                            headers={"x-session-id": session})
                    if reply.status_code != 200:
                        failures.append(f"{session}: {reply.status_code} {reply.text[:200]}")
                    answered.append(session)
                    turn += 1

            talkers = [asyncio.create_task(talk(s)) for s in sessions]
            survivors = [e for e in fleet.engines if e != victim]
            before = {e: await _external_hits(http, e) for e in survivors}
            # Every session is talking when the engine dies.
            await eventually(lambda: set(answered) == set(sessions), what="every session talked")
            fleet.child_of(victim).kill()
            uuids = {normalize_session(s.encode()): s for s in orphans}
            bound = await eventually(
                lambda: stored_bindings(stack.etcd_endpoints, prefix),
                until=lambda bound: all(bound.get(u) not in (None, victim) for u in uuids),
                what="the dead engine's sessions re-bound",
            )
            stop.set()
            await asyncio.gather(*talkers)
            assert failures == []
            new_homes = {uuids[u]: e for u, e in bound.items() if u in uuids}
            for s, home in new_homes.items():
                reply = await http.post("/v1/chat/completions", json=_chat(99, s),
                                        headers={"x-session-id": s})
                assert reply.headers["x-engine-id"] == home
            # The moved sessions found their KV in the shared DDR pool on their new engines.
            after = {e: await _external_hits(http, e) for e in set(new_homes.values())}
            assert all(after[e] > before[e] for e in after), (before, after)


async def test_drain_with_deadline_then_undrain(
    tmp_path: Path, fleet: EngineProcesses, prefix: str
) -> None:
    config = gateway_config(fleet.engines, prefix=prefix, kv_pool="memcache-a")
    async with running_stack(config, tmp_path / "stack") as stack:
        client = EtcdClient(stack.etcd_endpoints)
        ops = Operations(client, prefix)
        try:
            async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
                async def home_of(session: str) -> str:
                    reply = await http.post("/v1/chat/completions", json=_chat(0, session),
                                            headers={"x-session-id": session})
                    assert reply.status_code == 200
                    return reply.headers["x-engine-id"]

                batches = iter(range(1000))

                async def fresh_homes(count: int) -> set[str]:
                    """Where `count` sessions never seen before land (a new batch per call)."""
                    batch = next(batches)
                    return {await home_of(f"new-{batch}-{i}") for i in range(count)}

                homes = {f"old-{i}": await home_of(f"old-{i}") for i in range(12)}
                drained = max(set(homes.values()), key=list(homes.values()).count)
                staying = [s for s, h in homes.items() if h == drained]
                # A deadline far away: new sessions avoid the engine once ext_proc's watch has
                # seen the drain (40 new sessions all missing one of four engines by chance:
                # 0.75**40, about 1e-5), and its own sessions stay however long this takes.
                await ops.drain(drained, deadline_s=3600)
                await eventually(lambda: fresh_homes(40), until=lambda hosts: drained not in hosts,
                                 what="new sessions avoiding the drained engine")
                assert {await home_of(s) for s in staying} == {drained}
                # The deadline passes (set it to now): the leader moves its sessions.
                await ops.drain(drained, deadline_s=0)
                await eventually(lambda: _set_of(home_of, staying),
                                 until=lambda hosts: drained not in hosts,
                                 what="drained sessions moved after the deadline")
                await ops.undrain(drained)
                await eventually(lambda: fresh_homes(30), until=lambda hosts: drained in hosts,
                                 what="new sessions placed on the undrained engine again")
        finally:
            await client.close()


async def test_endpoints_fail_spreads_sessions_within_the_load_bound(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    ups = await upstreams(4)
    victim, sibling, *others = [u.address for u in ups]
    endpoints = [{"address": victim, "kv_pool": "ddr-a"}, {"address": sibling, "kv_pool": "ddr-a"},
                 *({"address": a, "kv_pool": "ddr-b"} for a in others)]
    config = gateway_config(endpoints, prefix=prefix, load_factor=1.25)
    sessions = [f"dev-{i}" for i in range(600)]
    async with running_stack(config, tmp_path / "stack") as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            for start in range(0, len(sessions), 25):
                batch = sessions[start:start + 25]
                replies = await asyncio.gather(*(
                    http.get("/v1/chat", headers={"x-session-id": s}) for s in batch))
                assert all(r.status_code == 200 for r in replies)
        before = Counter((await stored_bindings(stack.etcd_endpoints, prefix)).values())
        assert sum(before.values()) == len(sessions) and before[victim] > 100, before
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvgate_cli", "endpoints", "fail", victim,
            "--admin", str(config.control_plane.admin),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, err.decode()

        async def homes() -> Counter[str]:
            return Counter((await stored_bindings(stack.etcd_endpoints, prefix)).values())

        after = await eventually(homes, until=lambda counts: counts[victim] == 0,
                                 what="the failed engine's sessions re-bound")
    bound = math.ceil(1.25 * (len(sessions) + 1) / 3)  # the pool's sessions over 3 engines
    assert sum(after.values()) == len(sessions)
    assert max(after.values()) <= bound, (before, after)
    # The DDR-pool sibling took what its bound allowed; only the rest went to the other pool.
    assert after[sibling] == min(bound, before[sibling] + before[victim]), (before, after)
    spilled = sum(after[a] - before[a] for a in others)
    assert spilled == before[victim] - (after[sibling] - before[sibling]), (before, after)
