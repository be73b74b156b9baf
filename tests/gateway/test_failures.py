"""The gateway through its parts failing: ext_proc, an upstream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from kvgate.etcd import EtcdClient
from kvgate.placement import EnvoyRing, session_hash
from tests.support.polling import eventually, homes_of
from tests.support.stack import FAST_HEALTH, gateway_config, running_stack


class SteadyTraffic:
    """Sessions' requests in a loop; records every failure and every move."""

    def __init__(self, http: httpx.AsyncClient, homes: dict[str, str]) -> None:
        self._http = http
        self._homes = homes
        self.errors: list[str] = []
        self.sent = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def until_sent(self, count: int) -> None:
        await eventually(lambda: self.sent >= count, what=f"{count} requests sent")

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        while not self._stop.is_set():
            for session, home in self._homes.items():
                reply = await self._http.get("/v1/chat", headers={"x-session-id": session})
                self.sent += 1
                if reply.status_code != 200:
                    self.errors.append(f"{session}: HTTP {reply.status_code}")
                elif reply.json()["upstream"] != home:
                    self.errors.append(f"{session} moved to {reply.json()['upstream']}")


@pytest.mark.parametrize(
    ("ext_procs", "load_factor"),
    [
        # One of two replicas dies: Envoy retries the stream on the other, which serves the
        # same bindings from etcd.
        (2, 1.25),
        # The only replica dies: Envoy's ring_hash fallback takes over. With a generous load
        # factor every first placement was exactly Envoy's ring pick, so nobody moves.
        (1, 10.0),
    ],
    ids=["one-of-two-replicas", "all-replicas"],
)
@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_ext_proc_killed_mid_traffic_fails_nothing_and_moves_nobody(
    tmp_path: Path, upstreams, prefix: str, ext_procs: int, load_factor: float, transport: str
) -> None:
    ups = await upstreams(4)
    config = gateway_config([u.address for u in ups], prefix=prefix, ext_procs=ext_procs,
                            load_factor=load_factor, transport=transport)
    sessions = [f"conv-{i}" for i in range(30)]
    async with running_stack(config, tmp_path) as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            homes = await homes_of(http, sessions)
            traffic = SteadyTraffic(http, homes)
            traffic.start()
            await traffic.until_sent(60)
            stack.ext_procs[0].kill()
            await stack.ext_procs[0].process.wait()  # type: ignore[union-attr]
            await traffic.until_sent(traffic.sent + 150)
            await traffic.stop()
            # Over HTTP there is no stream retry: until Envoy's health check ejects the dead
            # replica, its share of requests falls back to Envoy's ring; after that, all home.
            after = await eventually(lambda: homes_of(http, sessions),
                                     until=lambda found: found == homes,
                                     what="every session home again")
    if ext_procs == 1:
        ring = EnvoyRing([(u.address, 1) for u in ups])
        assert all(homes[s] == ring.pick(session_hash(s.encode())) for s in sessions)
    if transport == "http" and ext_procs == 2:
        assert [e for e in traffic.errors if "moved" not in e] == []
    else:
        assert traffic.errors == []
    assert after == homes


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_dead_upstream_retried_elsewhere_and_session_rebound(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(4)
    # Room for every session anywhere, so the rebind always keeps the retry's choice (with the
    # default bound, where the random ports put the ring decides whether a sibling is full).
    config = gateway_config([u.address for u in ups], prefix=prefix, load_factor=3.0,
                            health=FAST_HEALTH, transport=transport)
    sessions = [f"user-{i}" for i in range(24)]
    async with running_stack(config, tmp_path) as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            homes = await homes_of(http, sessions)
            victim = next(u for u in ups if u.address in homes.values())
            orphans = [s for s, home in homes.items() if home == victim.address]
            await victim.stop()
            # The very next request of each orphaned session succeeds, on another upstream.
            moved = await homes_of(http, orphans)
            assert all(home != victim.address for home in moved.values())
            # The health checker fails the victim; ext_proc re-binds the sessions in etcd.
            client = EtcdClient(stack.etcd_endpoints)

            async def bindings() -> dict[str, bytes]:
                kvs, _ = await client.get_prefix(f"{prefix}bindings/".encode())
                await homes_of(http, orphans)  # the orphans keep asking meanwhile
                return {kv.key.decode().rsplit("/", 1)[1]: kv.value for kv in kvs}

            try:
                await eventually(
                    bindings,
                    until=lambda bound: all(victim.address.encode() not in v
                                            for v in bound.values()),
                    what="the dead upstream's sessions re-bound in etcd",
                )
            finally:
                await client.close()
            final = await homes_of(http, sessions)
        for session in sessions:
            if session in orphans:
                assert final[session] != victim.address
            else:
                assert final[session] == homes[session]  # nobody else moved
        # Orphans stay where the retry took them: the rebind follows the same ring walk.
        assert all(final[s] == moved[s] for s in orphans), (moved, final)
