"""The scale benchmark's system under test: a real etcd, a control plane and
two ext_proc replicas as child processes, and the measurements taken on them."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from bench.scale.decisions import Decisions
from bench.scale.engines import Engines
from bench.scale.measure import metrics, rss_bytes, until
from kvgate.admin_api.v1 import admin_pb2 as admin
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.bindings.bulk import write_bindings
from kvgate.bindings.index import session_key
from kvgate.bindings.leases import EpochLeases
from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.etcd.scan import scan
from kvgate.runtime.children.child import Child
from kvgate.runtime.children.etcd import embedded_etcd, etcd_ready
from kvgate.runtime.children.ports import free_ports
from kvgate.session import normalize_session
from stack.local import grpc_serving

REPO = Path(__file__).resolve().parents[2]
PREFIX = "/kvgate/bench/"
POOL = "coder"
ENGINES = 16
IDLE_TTL = 3600.0


def config_text(ports: dict[str, int], etcd: str, engines: list[int]) -> str:
    endpoints = ", ".join(f"{{address: '127.0.0.1:{p}', kv_pool: ddr-{i % 2}}}"
                          for i, p in enumerate(engines))
    return f"""\
listener: {{address: 127.0.0.1, port: {ports['listener']}}}
envoy_admin: {{address: 127.0.0.1, port: {ports['envoy_admin']}}}
control_plane: {{xds: 127.0.0.1:{ports['xds']}, admin: 127.0.0.1:{ports['admin']}}}
ext_proc: {{address: [127.0.0.1:{ports['ext_proc0']}, 127.0.0.1:{ports['ext_proc1']}],
           metrics: 127.0.0.1:{ports['metrics0']}}}
etcd: {{endpoints: ['{etcd}'], prefix: '{PREFIX}'}}
session: {{idle_ttl: 1h, max_bindings: 100000000}}
pools:
  - name: {POOL}
    endpoints: [{endpoints}]
    health: {{interval: 2s, timeout: 1s}}
"""


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        names = ["listener", "envoy_admin", "xds", "admin", "ext_proc0", "ext_proc1",
                 "metrics0", "metrics1", "cp_metrics", "etcd", "etcd_peer"]
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self.etcd_endpoint = f"127.0.0.1:{self.ports['etcd']}"
        self.engines = Engines(free_ports(ENGINES))
        self.children: list[Child] = []
        self.replicas: list[Child | None] = [None, None]
        self.results: dict[str, Any] = {"bindings": args.bindings}
        self.http: aiohttp.ClientSession | None = None
        self.say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)

    # -- processes -------------------------------------------------------------------------

    async def start(self) -> None:
        self.etcd = embedded_etcd(self.workdir / "etcd-data", self.ports["etcd"],
                                  self.ports["etcd_peer"], self.workdir / "etcd.log")
        self.etcd.argv[self.etcd.argv.index("--quota-backend-bytes") + 1] = str(8 * 1024**3)
        await self._launch(self.etcd, lambda: etcd_ready(self.etcd_endpoint))
        await self.engines.start()
        self.config = self.workdir / "kvgate.yaml"
        self.config.write_text(config_text(self.ports, self.etcd_endpoint, self.engines.ports))
        cp = Child("control-plane", [
            sys.executable, "-m", "control_plane", "-c", str(self.config),
            "--etcd", self.etcd_endpoint, "--metrics", f"127.0.0.1:{self.ports['cp_metrics']}",
        ], self.workdir / "control-plane.log")
        await self._launch(cp, lambda: grpc_serving_at(f"127.0.0.1:{self.ports['admin']}"))
        for index in (0, 1):
            await self.start_replica(index)

    async def start_replica(self, index: int) -> Child:
        child = Child(f"ext_proc[{index}]", [
            sys.executable, "-m", "ext_proc", "-c", str(self.config),
            "--listen", f"127.0.0.1:{self.ports[f'ext_proc{index}']}",
            "--metrics", f"127.0.0.1:{self.ports[f'metrics{index}']}",
            "--etcd", self.etcd_endpoint,
        ], self.workdir / f"ext_proc-{index}.log")
        await self._launch(child, lambda: grpc_serving_at(self.replica_address(index)), 120)
        self.replicas[index] = child
        return child

    async def _launch(self, child: Child, ready: Callable[[], Awaitable[bool]],
                      within: float = 60) -> None:
        self.children.append(child)
        await child.start()
        await child.wait_ready(ready, within)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        for child in reversed(self.children):
            await child.stop()
        await self.engines.stop()

    def replica_address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[f'ext_proc{index}']}"

    async def replica_metrics(self, index: int) -> dict[str, float]:
        if self.http is None:  # made inside the running loop
            self.http = aiohttp.ClientSession()
        return await metrics(self.http, f"http://127.0.0.1:{self.ports[f'metrics{index}']}/metrics")

    async def held(self, index: int) -> tuple[int, bool, float]:
        """(bindings held, bindings mirror synced, relists) of a replica."""
        found = await self.replica_metrics(index)
        labels = '{mirror="bindings",service="ext_proc"}'
        return (int(found.get("kvgate_ext_proc_bindings", 0)),
                found.get(f"kvgate_etcd_mirror_synced{labels}") == 1.0,
                found.get(f"kvgate_etcd_mirror_relists_total{labels}", 0.0))

    def rss(self, index: int) -> int:
        child = self.replicas[index]
        assert child is not None and child.pid is not None
        return rss_bytes(child.pid)

    # -- phases ----------------------------------------------------------------------------

    async def fill(self) -> list[str]:
        """N bindings: the first through ext_proc's gRPC interface, the rest in bulk."""
        n, through = self.args.bindings, min(self.args.through_grpc, self.args.bindings)
        sessions = [f"bench-{i}" for i in range(through)]
        decisions = Decisions(self.replica_address(0), POOL)
        started = time.perf_counter()
        for start in range(0, through, 32):
            await asyncio.gather(*(decisions.decide(s) for s in sessions[start:start + 32]))
        grpc_s = time.perf_counter() - started
        await decisions.close()
        client = EtcdClient([self.etcd_endpoint])
        leases = await EpochLeases(client, PREFIX, IDLE_TTL / 4,
                                   int(IDLE_TTL * 1.5)).leases_for(int(time.time() // 900))
        rng = random.Random(13)  # clients' session ids: random UUIDs, the same every run
        bulk = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n - through)]
        started = time.perf_counter()
        await write_bindings(client, PREFIX, (
            Binding(s, POOL, f"127.0.0.1:{self.engines.ports[i % ENGINES]}", hash=i + 1)
            for i, s in enumerate(bulk)), lambda b: leases.of(session_key(b.session)), 8)
        bulk_s = time.perf_counter() - started
        await client.close()
        self.results["fill"] = {"through_grpc": through, "grpc_decisions_per_s": through / grpc_s,
                                "bulk": n - through, "bulk_bindings_per_s": (n - through) / bulk_s}
        self.say(f"  filled: {through} through gRPC ({through / grpc_s:.0f}/s), "
                 f"{n - through} in bulk ({(n - through) / max(bulk_s, 1e-9):.0f}/s)")
        return sessions + bulk[:5000]

    async def until_held(self, index: int, within: float = 600) -> float:
        started = time.perf_counter()
        while True:
            try:
                held, synced, _ = await self.held(index)
            except (aiohttp.ClientError, TimeoutError):
                held, synced = 0, False
            if held >= self.args.bindings and synced:
                return time.perf_counter() - started
            if time.perf_counter() - started > within:
                raise RuntimeError(f"replica {index} holds {held} after {within}s")
            await asyncio.sleep(0.05)

    async def watch_lag(self, samples: int = 200) -> dict[str, float]:
        """A new session decided on replica 0 until replica 1's mirror has applied its write."""
        decisions = Decisions(self.replica_address(0), POOL)
        client = EtcdClient([self.etcd_endpoint])
        lags = []
        labels = 'kvgate_etcd_mirror_revision{mirror="bindings",service="ext_proc"}'
        for i in range(samples):
            session = f"lag-{i}"
            await decisions.decide(session)
            decided = time.perf_counter()
            kv = await client.get(f"{PREFIX}bindings/{POOL}/"
                                  f"{normalize_session(session.encode())}".encode())
            assert kv is not None
            while (await self.replica_metrics(1)).get(labels, 0) < kv.mod_revision:
                pass
            lags.append(time.perf_counter() - decided)
            await asyncio.sleep(0.02)
        await decisions.close()
        await client.close()
        lags.sort()
        return {"samples": samples, "p50_ms": 1000 * lags[len(lags) // 2],
                "p99_ms": 1000 * lags[int(len(lags) * 0.99) - 1], "max_ms": 1000 * lags[-1]}

    async def admin_times(self) -> dict[str, float]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.ports['admin']}") as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            times = {}
            for name, method, request in (
                ("status_s", stub.Status, admin.StatusRequest()),
                ("endpoints_list_s", stub.ListEndpoints, admin.ListEndpointsRequest()),
                ("sessions_list_100_s", stub.ListSessions, admin.ListSessionsRequest(limit=100)),
            ):
                started = time.perf_counter()
                await method(request)
                times[name] = time.perf_counter() - started
            return times

    async def failover(self) -> dict[str, float]:
        """Fail one engine by hand; the leader moves its sessions (paged scan, batched CAS).
        Timed by following the bindings' watch from the moment of the request."""
        victim = f"127.0.0.1:{self.engines.ports[0]}"
        marker = f'"{victim}"'.encode()
        client = EtcdClient([self.etcd_endpoint])
        base = f"{PREFIX}bindings/{POOL}/".encode()
        on_victim: set[bytes] = set()
        revision = 0
        async for page, at in scan(client, base):
            on_victim.update(kv.key for kv in page if marker in kv.value)
            revision = at
        count = len(on_victim)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.ports['admin']}") as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            started = time.perf_counter()
            await stub.FailEndpoint(admin.FailEndpointRequest(address=victim))
            async for events, _ in client.watch_prefix(base, revision + 1):
                for event in events:
                    if event.deleted or marker not in event.kv.value:
                        on_victim.discard(event.kv.key)
                if not on_victim:
                    break
            moved_s = time.perf_counter() - started
            await stub.UndrainEndpoint(admin.UndrainEndpointRequest(address=victim))
        await client.close()
        return {"engine_sessions": count, "engine_sessions_moved_within_s": moved_s}

    async def probes(self, sessions: list[str]) -> list[asyncio.subprocess.Process]:
        """A decision every 10 ms to each replica, each probe its own process."""
        known = self.workdir / "known-sessions.txt"
        known.write_text("\n".join(sessions[:5000]))
        started = []
        for index in (0, 1):
            # Ahead of other processes for the CPU when it can be (root), so what it measures
            # is the replica's delay, not its own wait for a core on a busy machine.
            nice = ("nice", "-n", "-10") if os.geteuid() == 0 else ()
            started.append(await asyncio.create_subprocess_exec(
                *nice, sys.executable, "-m", "bench.scale.probe",
                self.replica_address(index),
                POOL, str(known), str(self.workdir / f"probe-{index}.jsonl"), "0.01",
                stdin=asyncio.subprocess.PIPE, cwd=REPO))
        return started

    def probe_report(
        self, index: int, windows: dict[str, tuple[float, float]]
    ) -> dict[str, object]:
        rows = [json.loads(line) for line in
                (self.workdir / f"probe-{index}.jsonl").read_text().splitlines() if line]
        report: dict[str, object] = {}
        for name, (start, end) in windows.items():
            inside = [r for r in rows if start <= r[0] <= end]
            answered = sorted(r[1] for r in inside if r[1] is not None)
            known = sorted(r[1] for r in inside if r[1] is not None and not r[3])
            new = sorted(r[1] for r in inside if r[1] is not None and r[3])
            report[name] = {
                "decisions": len(answered), "refused": len(inside) - len(answered),
                "slowest_ms": round(1000 * answered[-1], 1) if answered else None,
                "slowest_known_session_ms": round(1000 * known[-1], 1) if known else None,
                "slowest_new_session_ms": round(1000 * new[-1], 1) if new else None,
                "p99_ms": round(1000 * answered[int(len(answered) * 0.99) - 1], 2)
                if len(answered) >= 100 else None,
            }
        return report

    async def restart(self, index: int) -> dict[str, float]:
        child = self.replicas[index]
        assert child is not None
        await child.stop()
        self.children.remove(child)
        started = time.perf_counter()
        await self.start_replica(index)
        serving = time.perf_counter() - started
        held = await self.until_held(index)
        return {"serving_after_s": serving, "holds_all_after_s": serving + held}

    async def etcd_stall(self, seconds: float, rate: float = 300.0) -> dict[str, float]:
        """New sessions keep arriving at replica 0 while etcd is frozen (SIGSTOP) for `seconds`;
        how long after it answers again both replicas are out of degraded mode with nothing
        queued."""
        decisions = Decisions(self.replica_address(0), POOL)
        stop = asyncio.Event()
        inflight: set[asyncio.Future[str]] = set()

        async def load() -> None:
            sent = 0
            while not stop.is_set():
                request = asyncio.ensure_future(decisions.decide(f"stall-{sent}", limit_s=5))
                inflight.add(request)
                request.add_done_callback(inflight.discard)
                sent += 1
                await asyncio.sleep(1 / rate)

        loading = asyncio.create_task(load())
        await asyncio.sleep(1)
        assert self.etcd.pid is not None
        os.kill(self.etcd.pid, signal.SIGSTOP)
        await asyncio.sleep(seconds)
        most = 0
        for index in (0, 1):
            found = await self.replica_metrics(index)
            most = max(most, int(found.get("kvgate_ext_proc_pending_writes", 0)))
        os.kill(self.etcd.pid, signal.SIGCONT)
        resumed = time.perf_counter()

        async def recovered() -> bool:
            found = [await self.replica_metrics(i) for i in (0, 1)]
            return all(f.get("kvgate_ext_proc_degraded") == 0 and
                       f.get("kvgate_ext_proc_pending_writes") == 0 for f in found)

        await until(recovered, 0.01)
        left = time.perf_counter() - resumed
        stop.set()
        await loading
        await asyncio.gather(*inflight, return_exceptions=True)
        await decisions.close()
        return {"stall_s": seconds, "new_sessions_per_s": rate, "queued_at_most": most,
                "degraded_mode_left_after_s": left}

    async def relist(self) -> dict[str, float]:
        """etcd restarts: every watch is lost; the replicas relist in pages, in place."""
        before = [(await self.held(i))[2] for i in (0, 1)]
        await self.etcd.stop()
        await self.etcd.start()
        await self.etcd.wait_ready(lambda: etcd_ready(self.etcd_endpoint), 60)
        started = time.perf_counter()
        for index in (0, 1):
            while True:
                held, synced, relists = await self.held(index)
                if relists > before[index] and synced and held >= self.args.bindings:
                    break
                await asyncio.sleep(0.1)
        return {"both_relisted_within_s": time.perf_counter() - started}

    def memory(self, name: str, baseline: list[int]) -> None:
        per = [(self.rss(i) - baseline[i]) / self.args.bindings for i in (0, 1)]
        rss = [self.rss(i) for i in (0, 1)]
        self.results.setdefault("rss", {})[name] = {
            "bytes_per_binding": [round(p) for p in per], "rss_mb": [round(r / 2**20) for r in rss]}
        self.say(f"  RSS {name}: {[round(r / 2**20) for r in rss]} MB, "
                 f"{[round(p) for p in per]} B per binding")



async def grpc_serving_at(address: str) -> bool:
    host, _, port = address.rpartition(":")
    from kvgate.config.model import HostPort
    return await grpc_serving(HostPort(host, int(port)))
