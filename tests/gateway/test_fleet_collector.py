"""Fleet state gathered once (`placement.load_gate.source: collector`), end to end: real etcd,
control plane, three ext_proc replicas and Envoy in front of two test engines that serve vLLM's
load gauges and count the scrapes they get.

- Each engine is scraped once per collector round, at most once per interval, whatever the
  number of replicas (counted at the engine); the replicas scrape nothing themselves.
- Every replica gets the figures with their ages, and its decisions use them: new sessions
  avoid the engine whose queue is long.
- The collector dies (its control plane is killed): every replica says so (metrics and
  `kvgate status`, asked of another control-plane replica), its figures age out, decisions
  still succeed, bound sessions stay put and new ones follow the ring again (static
  stickiness)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import httpx

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.config.model import HostPort
from kvgate.runtime.children.child import Child
from stack.local import grpc_serving
from tests.admin.admin_helpers import run_cli
from tests.support.polling import eventually
from tests.support.ports import free_ports
from tests.support.stack import gateway_config, running_stack
from tests.support.upstreams import Upstream

INTERVAL = 0.1  # refresh_s
MAX_AGE = 0.5  # max_load_age_s
REPLICAS = 3
BODY = {"prompt": "x" * 4000}  # ~1,000 tokens by content-length: a prefill worth booking


def gauges(waiting: int) -> str:
    return (f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
            'vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n')


def sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def replica_metrics(http: httpx.AsyncClient, addresses: list[HostPort]) -> list[str]:
    return [(await http.get(f"http://{a}/metrics")).text for a in addresses]


async def collector_rounds(admin: HostPort) -> int:
    async with grpc.aio.insecure_channel(str(admin)) as channel:
        status = await admin_pb2_grpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=30)
    assert status.fleet_collector.collecting, status.fleet_collector
    return int(status.fleet_collector.rounds)


async def route(http: httpx.AsyncClient, session: str) -> str:
    reply = await http.post("/v1/completions", json=BODY, headers={"x-session-id": session})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["upstream"])


async def status_of(admin: str) -> str:
    shown = await run_cli("status", admin=admin)
    assert shown.code == 0, shown.err
    return shown.out


async def test_engines_are_scraped_once_for_all_replicas_and_a_dead_collector_degrades(
    tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]], prefix: str,
) -> None:
    busy, calm = await upstreams(2)
    busy.metrics_page, calm.metrics_page = gauges(1000), gauges(0)
    # load_factor 100: the bound never overrides the gate's choice between the two engines.
    config = gateway_config([busy.address, calm.address], ext_procs=REPLICAS, prefix=prefix,
                            load_factor=100.0, placement={"load_gate": {
                                "source": "collector", "refresh_s": f"{INTERVAL * 1000:g}ms",
                                "max_load_age_s": f"{MAX_AGE * 1000:g}ms"}})
    admin = config.control_plane.admin
    second: Child | None = None
    async with running_stack(config, tmp_path / "stack") as stack, \
            httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=60) as http:
        try:
            replicas = stack.ext_proc_metrics
            assert len(replicas) == REPLICAS

            # (b) every replica follows the collector: rounds arrive, the newest figure is young
            def following(pages: list[str]) -> bool:
                return all(sample(p, "kvgate_ext_proc_fleet_collector_reachable") == 1.0
                           and (sample(p, "kvgate_ext_proc_fleet_state_rounds_total") or 0) > 0
                           for p in pages)

            pages = await eventually(lambda: replica_metrics(http, replicas), until=following,
                                     what="every replica receives the collector's rounds")
            for text in pages:
                age = sample(text, "kvgate_ext_proc_fleet_state_age_seconds")
                assert age is not None and 0.0 <= age <= MAX_AGE
                # the replicas scrape nothing themselves
                assert "kvgate_ext_proc_engine_scrapes_total" not in text

            # (a) one scrape per engine per round, at most one per interval, for 3 replicas
            loop = asyncio.get_running_loop()
            first = await collector_rounds(admin)
            scraped, started = [busy.scrapes, calm.scrapes], loop.time()
            last = await eventually(lambda: collector_rounds(admin),
                                    until=lambda r: r >= first + 20, what="20 more rounds")
            now_scraped, elapsed = [busy.scrapes, calm.scrapes], loop.time() - started
            rounds = last - first
            for before, after in zip(scraped, now_scraped, strict=True):
                # +1: the round after `last` may have reached an engine before its status did
                assert rounds - 1 <= after - before <= rounds + 1, (before, after, rounds)
                assert after - before <= elapsed / INTERVAL + 2, (after - before, elapsed)

            # the figures steer decisions: every replica has booked a request (so it prices a
            # queue), then new sessions avoid the busy engine
            warm = iter(range(1000))

            async def all_decided() -> bool:
                await route(http, f"warm-{next(warm)}")
                return all((sample(p, 'kvgate_ext_proc_decisions_total{outcome="new"}') or 0) > 0
                           for p in await replica_metrics(http, replicas))

            await eventually(all_decided, what="each replica has decided a request")
            # A figure is priced as it arrives (waiting × the mean prefill booked so far, as a
            # scraped one is): two more rounds, so no replica holds one priced before it booked.
            seen = [sample(p, "kvgate_ext_proc_fleet_state_rounds_total") or 0
                    for p in await replica_metrics(http, replicas)]
            await eventually(lambda: replica_metrics(http, replicas), what="two more rounds",
                             until=lambda pages: all(
                                 (sample(p, "kvgate_ext_proc_fleet_state_rounds_total") or 0)
                                 >= s + 2 for p, s in zip(pages, seen, strict=True)))
            homes = {s: await route(http, s) for s in (f"fresh-{i}" for i in range(12))}
            assert set(homes.values()) == {calm.address}, homes

            # (c) the collector dies with its control plane
            assert stack.control_plane is not None
            stack.control_plane.kill()

            def unreachable(pages: list[str]) -> bool:
                return all(sample(p, "kvgate_ext_proc_fleet_collector_reachable") == 0.0
                           for p in pages)

            pages = await eventually(lambda: replica_metrics(http, replicas), until=unreachable,
                                     what="every replica reports the collector unreachable")
            for text in pages:
                age = sample(text, "kvgate_ext_proc_fleet_state_age_seconds")
                assert age is not None and age > MAX_AGE
            # decisions still succeed: bound sessions stay, new ones follow the ring again
            for session, home in homes.items():
                assert await route(http, session) == home
            after = [await route(http, f"after-{i}") for i in range(20)]
            assert busy.address in after, after  # the stale queue counts for nothing

            # `kvgate status`, from another control-plane replica, names the degraded replicas
            other_admin, other_xds = (HostPort("127.0.0.1", p) for p in free_ports(2))
            second = Child("control-plane-2", [
                sys.executable, "-m", "control_plane", "-c",
                str(stack.workdir / "kvgate.effective.yaml"), "--etcd",
                ",".join(stack.etcd_endpoints), "--admin", str(other_admin),
                "--xds", str(other_xds), "--identity", "control-plane-2",
            ], tmp_path / "control-plane-2.log")
            await second.start()
            await second.wait_ready(lambda: grpc_serving(other_admin), 60)
            shown = await eventually(
                lambda: status_of(str(other_admin)),
                until=lambda text: text.count("COLLECTOR UNREACHABLE") == REPLICAS,
                what="kvgate status shows every replica without its collector")
            assert "static stickiness" in shown
        finally:
            if second is not None:
                await second.stop()
