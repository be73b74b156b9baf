"""HBM residency end to end (`placement.load_gate.kv_events_port_offset`): real etcd, control
plane, two ext_proc replicas and Envoy in front of two emulated engines that publish vLLM's KV
cache events. A session's turns go through the gateway with its `x-session-id` header, which
reaches the engine and tags its stored blocks; the collector reads both engines' streams and
streams what each HBM holds of the session, and what it stored there, to every replica. When
other prompts push the session's context out of its engine's HBM, the collector says so (0
tokens, of what it stored)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import httpx

from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.config.model import HostPort
from kvgate.session import normalize_session
from tests.support.collector import residency_of, stored_of
from tests.support.polling import eventually
from tests.support.ports import free_ports
from tests.support.stack import gateway_config, running_stack

BS = 16
HBM_BLOCKS = 32
SESSION = "residency-session"
UPSTREAM = "x-kvgate-upstream"  # Envoy names the engine that answered


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def offset_ports(count: int) -> tuple[list[int], int]:
    """``count`` free ports and an offset that leaves each port + offset free too."""
    ports = free_ports(count)
    for offset in range(1, 2000):
        if all(p + offset < 65536 and p + offset not in ports and _free(p + offset)
               for p in ports):
            return ports, offset
    raise AssertionError(f"no free offset for {ports}")


@asynccontextmanager
async def engines(ports: list[int], offset: int) -> AsyncIterator[list[str]]:
    async with AsyncExitStack() as stack:
        for port in ports:
            await stack.enter_async_context(Fleet(EmulatorOptions(
                instances=1, ports=(port,), time_scale=0, no_ddr_pool=True, block_size=BS,
                hbm_tokens=HBM_BLOCKS * BS, kv_events_port=port + offset)))
        yield [f"127.0.0.1:{p}" for p in ports]


async def eviction_rates(admin: HostPort) -> dict[str, float]:
    """Each engine's eviction rate in the collector's stream (blocks per second; NaN: unknown)."""
    async with grpc.aio.insecure_channel(str(admin)) as channel:
        call = admin_pb2_grpc.AdminStub(channel).WatchFleetLoad(pb.WatchFleetLoadRequest())
        async for frame in call:
            call.cancel()
            return dict(zip(frame.loads.endpoint, frame.loads.eviction_rate, strict=False))
    return {}


async def test_the_collector_streams_what_each_engines_hbm_holds_of_a_session(
        tmp_path: Path, prefix: str) -> None:
    ports, offset = offset_ports(2)
    async with engines(ports, offset) as addresses:
        config = replace(gateway_config(addresses, ext_procs=2, prefix=prefix, placement={
            "load_gate": {"source": "collector", "refresh_s": "100ms",
                          "kv_events_port_offset": offset}}), upstream_header=UPSTREAM)
        admin = config.control_plane.admin
        key = normalize_session(SESSION.encode())
        assert key is not None
        async with running_stack(config, tmp_path / "stack") as stack, \
                httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=60) as http:
            prompt = list(range(1000, 1000 + 10 * BS))
            for _ in range(2):
                reply = await http.post("/v1/completions", headers={"x-session-id": SESSION},
                                        json={"prompt": prompt, "max_tokens": 1})
                assert reply.status_code == 200, reply.text
            home = reply.headers[UPSTREAM]

            def holds_it(seen: dict[str, int | None]) -> bool:
                return (seen.get(home) or 0) >= 10 * BS

            await eventually(lambda: residency_of(admin, key), until=holds_it,
                             what="the collector reports the session's blocks in HBM")

            async def replicas_know(gauge: str = "kvgate_ext_proc_hbm_residency_pairs"
                                    ) -> list[float]:
                pages = [(await http.get(f"http://{a}/metrics")).text
                         for a in stack.ext_proc_metrics]
                return [float(line.rsplit(" ", 1)[1]) for page in pages
                        for line in page.splitlines() if line.startswith(f"{gauge} ")]

            await eventually(replicas_know, until=lambda n: len(n) == 2 and min(n) >= 1,
                             what="every replica holds the session's residency")

            # Other prompts, straight to its engine, push its blocks out of HBM.
            async with httpx.AsyncClient(timeout=60) as direct:
                for i in range(4):
                    other = list(range(2000 + i * 20 * BS, 2000 + (i + 1) * 20 * BS))
                    flood = await direct.post(f"http://{home}/v1/completions",
                                              json={"prompt": other, "max_tokens": 1})
                    assert flood.status_code == 200, flood.text
            await eventually(lambda: residency_of(admin, key),
                             until=lambda seen: seen.get(home) == 0,
                             what="the collector reports the session's context gone")
            # What it stored there stays known: held over stored is the share the gate takes
            # of the session's context (kvgate.placement.signals.held_context).
            held, stored = (await stored_of(admin, key))[home]
            assert held == 0 and stored >= 10 * BS
            # Those evictions make the engine's eviction rate, once the collector has a few
            # seconds of samples (kvgate.placement.evictions.MIN_SPAN_S), and every replica
            # has it; the engine that evicted nothing evicts at 0.
            other = next(a for a in addresses if a != home)
            rates = await eventually(lambda: eviction_rates(admin),
                                     until=lambda r: r.get(home, 0.0) > 0.0,
                                     what="the collector reports the engine evicting")
            assert rates[other] == 0.0
            await eventually(lambda: replicas_know("kvgate_ext_proc_hbm_eviction_rates"),
                             until=lambda n: len(n) == 2 and min(n) == 2,
                             what="every replica holds both engines' eviction rates")
