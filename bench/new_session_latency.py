"""ext_proc's answer time for new and sticky sessions, with the cores idle, then kept busy, then
(with `--etcd-pause`) kept busy while etcd stalls: a real etcd, stub engines and one ext_proc
replica (`python -m ext_proc`, load gate on as by default, scraping the stubs) as child
processes on free loopback ports; a real gRPC client sends Envoy's request-headers message,
new sessions and already-bound ones alternately, open loop.

    python bench/new_session_latency.py [--busy 8] [--fsync 0] [--etcd-pause 0.5]
                                        [--rate 100] [--duration 10] [--rounds 1]

`--busy`: busy-loop processes on the cores (load average ~busy + 2); `--fsync`: processes
writing and fsyncing 1 MiB again and again beside them (another test's etcd). `--etcd-pause`:
in a third phase, etcd is stopped (SIGSTOP) for that long every 2 s, as a long fsync stalls it.
Printed per kind and phase: answer time p50 / p99 / max, and each loaded phase over the quiet
one of the same round (no absolute figure is compared across runs). Per phase also: ext_proc's
own decision time p99 (its histogram's bucket bound; its top bucket is 0.1 s), this client's
event-loop lag p99 (its share of the answer time), the writes ext_proc queued and its degraded
spells (`binding_write_queued`, logged only outside one, and `etcd_degraded` in its log), and
etcd's WAL fsync p99 (its /metrics).
The suite's `ext_proc.message_timeout`, 5 s, is the default here (`--message-timeout`): it sets
the write's deadline (100 ms) and budget (1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config.model import HostPort
from kvgate.runtime.children.child import Child
from kvgate.runtime.children.etcd import embedded_etcd, etcd_ready
from kvgate.runtime.children.ports import free_ports
from stack.local import grpc_serving

REPO = Path(__file__).resolve().parents[1]
# Envoy's ext_proc call, which ext_proc serves as a unary one (ext_proc/server.py).
METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
KINDS = ("new", "sticky")
PAUSE_EVERY_S = 2.0
# What another test's etcd does to the disk: 1 MiB written and fsynced, again and again.
_FSYNC_LOOP = ("import os, sys\nf = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
               "while True:\n    os.pwrite(f, b'x' * 1048576, 0)\n    os.fsync(f)\n")


def config_text(ports: dict[str, int], engines: list[str], message_timeout: str) -> str:
    members = ", ".join(f"{{address: '{a}', kv_pool: ddr-{i % 2}}}"
                        for i, a in enumerate(engines))
    return (f"ext_proc: {{address: 127.0.0.1:{ports['ext_proc']}, "
            f"metrics: 127.0.0.1:{ports['metrics']}, message_timeout: {message_timeout}}}\n"
            f"etcd: {{endpoints: ['127.0.0.1:{ports['etcd']}'], prefix: /kvgate/bench/}}\n"
            f"pools: [{{name: coder, endpoints: [{members}]}}]\n")


def headers_request(session: str) -> bytes:
    """Envoy's request-headers message for a chat request of `session` (~1,000 tokens)."""
    headers = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in (
        (":method", "POST"), (":path", "/v1/chat/completions"), ("x-session-id", session),
        ("content-length", "4000"))]
    message = pb.ProcessingRequest(request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=headers), end_of_stream=False))
    return bytes(message.SerializeToString())


@dataclass(frozen=True, slots=True)
class Load:
    name: str
    busy: int = 0  # busy-loop processes
    fsync: int = 0  # fsync loops
    etcd_pause_s: float = 0.0  # etcd stopped this long every PAUSE_EVERY_S


@dataclass
class Phase:
    load: Load
    times: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    lags: list[float] = field(default_factory=list)  # this client's event-loop lag
    failed: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def buckets(text: str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative buckets in `text`, summed over its label sets."""
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                found[le] = found.get(le, 0.0) + sample.value
    return found


def gathered_quantile(before: str, after: str, name: str, q: float) -> float:
    """The bound of the bucket holding quantile `q` of what histogram `name` gathered between
    two pages."""
    start, end = buckets(before, name), buckets(after, name)
    diff = {le: count - start.get(le, 0.0) for le, count in end.items()}
    total = diff.get(math.inf, 0.0)
    return next((le for le in sorted(diff) if total and diff[le] >= q * total), math.nan)


def page(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def loads(busy: int, fsync: int, workdir: Path) -> list[subprocess.Popen[bytes]]:
    """`busy` processes spinning on the CPU, `fsync` writing and syncing a file each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(busy)] + [
        subprocess.Popen([sys.executable, "-c", _FSYNC_LOOP, str(workdir / f"fsync-{i}")])
        for i in range(fsync)]


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        names = ["ext_proc", "metrics", "etcd", "etcd_peer"]
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self.children: list[Child] = []
        self.sticky = [str(uuid.uuid4()) for _ in range(args.sticky_sessions)]
        self.ext_proc_log = workdir / "ext_proc.log"
        self.etcd: Child | None = None

    async def start(self) -> None:
        etcd = self.etcd = embedded_etcd(self.workdir / "etcd-data", self.ports["etcd"],
                                         self.ports["etcd_peer"], self.workdir / "etcd.log")
        await self._started(etcd, lambda: etcd_ready(f"127.0.0.1:{self.ports['etcd']}"))
        ready = self.workdir / "engines.json"
        await self._started(Child("engines", [
            sys.executable, str(REPO / "bench" / "stub_engines.py"),
            "--engines", str(self.args.engines), "--ready", str(ready)],
            self.workdir / "engines.log"), lambda: asyncio.to_thread(_json_list, ready))
        config = self.workdir / "kvgate.yaml"
        config.write_text(config_text(self.ports, json.loads(ready.read_text()),
                                      self.args.message_timeout))
        await self._started(
            Child("ext_proc", [sys.executable, "-m", "ext_proc", "-c", str(config)],
                  self.ext_proc_log),
            lambda: grpc_serving(HostPort("127.0.0.1", self.ports["ext_proc"])))

    async def _started(self, child: Child, ready: Callable[[], Awaitable[bool]]) -> None:
        self.children.append(child)
        await child.start()
        await child.wait_ready(ready, 60)

    async def stop(self) -> None:
        self._pause(False)
        for child in reversed(self.children):
            await child.stop()

    def _pause(self, paused: bool) -> None:
        if self.etcd is not None and self.etcd.pid is not None and self.etcd.running:
            os.kill(self.etcd.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    async def bind_sticky(self, channel: grpc.aio.Channel) -> None:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
        for start in range(0, len(self.sticky), 20):
            await asyncio.gather(*(call(headers_request(s), timeout=30)
                                   for s in self.sticky[start:start + 20]))

    async def phase(self, channel: grpc.aio.Channel, load: Load) -> Phase:
        result = Phase(load)
        metrics = (f"127.0.0.1:{self.ports['metrics']}", f"127.0.0.1:{self.ports['etcd']}")
        before = [await asyncio.to_thread(page, m) for m in metrics]
        queued, degraded = self._logged("binding_write_queued"), self._logged("etcd_degraded")
        hogs = loads(load.busy, load.fsync, self.workdir)
        side = [asyncio.ensure_future(self._lag(result.lags))]
        if load.etcd_pause_s:
            side.append(asyncio.ensure_future(self._stalls(load.etcd_pause_s)))
        try:
            await self._traffic(channel, result)
        finally:
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            self._pause(False)
            for hog in hogs:
                hog.kill()
                hog.wait()
        after = [await asyncio.to_thread(page, m) for m in metrics]
        result.extra = {
            "decision_p99_s": gathered_quantile(before[0], after[0],
                                                "kvgate_ext_proc_decision_seconds", 0.99),
            "fsync_p99_s": gathered_quantile(before[1], after[1],
                                             "etcd_disk_wal_fsync_duration_seconds", 0.99),
            "queued": self._logged("binding_write_queued") - queued,
            "degraded": self._logged("etcd_degraded") - degraded,
        }
        return result

    async def _traffic(self, channel: grpc.aio.Channel, result: Phase) -> None:
        """`--rate` requests a second for `--duration`, alternately a new session and a turn
        of a bound one, each sent on time whatever the answers before it."""
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)

        async def one(kind: str, session: str) -> None:
            started = time.perf_counter()
            try:
                await call(headers_request(session), timeout=30)
            except grpc.aio.AioRpcError:
                result.failed += 1
                return
            result.times[kind].append(time.perf_counter() - started)

        loop = asyncio.get_running_loop()
        start, tasks = loop.time(), []
        for i in range(int(self.args.duration * self.args.rate)):
            await asyncio.sleep(max(0.0, start + i / self.args.rate - loop.time()))
            kind, session = (("sticky", self.sticky[i % len(self.sticky)]) if i % 2
                             else ("new", str(uuid.uuid4())))
            tasks.append(asyncio.ensure_future(one(kind, session)))
        await asyncio.gather(*tasks)

    async def _stalls(self, pause_s: float) -> None:
        while True:
            await asyncio.sleep(PAUSE_EVERY_S - pause_s)
            self._pause(True)
            try:
                await asyncio.sleep(pause_s)
            finally:
                self._pause(False)

    @staticmethod
    async def _lag(lags: list[float]) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - started - 0.01)

    def _logged(self, event: str) -> int:
        return self.ext_proc_log.read_text(errors="replace").count(f'"{event}"')


def _json_list(path: Path) -> bool:
    """`path` holds a whole JSON list (the stub engines write it once they listen)."""
    try:
        return isinstance(json.loads(path.read_text()), list)
    except (OSError, ValueError):
        return False


def report(phases: list[Phase]) -> None:
    quiet = phases[0]
    print(f"{'kind':7} {'phase':34} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
          f"   {'p50 x':>6} {'p99 x':>6} {'max x':>6}")
    for kind in KINDS:
        base = quiet.times[kind]
        for phase in phases:
            times = phase.times[kind]
            figures = [quantile(times, 0.5), quantile(times, 0.99), max(times, default=0.0)]
            ratios = [f / b for f, b in zip(figures, [quantile(base, 0.5),
                                                      quantile(base, 0.99), max(base)],
                                            strict=True)]
            print(f"{kind:7} {phase.load.name:34} {len(times):5d} "
                  + " ".join(f"{f * 1e3:8.2f}" for f in figures) + "   "
                  + ("" if phase is quiet else " ".join(f"{r:6.1f}" for r in ratios)))
    for phase in phases:
        extra = phase.extra
        print(f"{phase.load.name}: failed {phase.failed}; ext_proc decision p99 <= "
              f"{extra['decision_p99_s'] * 1e3:g} ms; client loop lag p99 "
              f"{quantile(phase.lags, 0.99) * 1e3:.1f} ms; writes queued {int(extra['queued'])}"
              f" and degraded spells {int(extra['degraded'])} (ext_proc's log); etcd WAL fsync "
              f"p99 <= {extra['fsync_p99_s'] * 1e3:g} ms")


async def run(args: argparse.Namespace) -> None:
    loaded = f"busy x{args.busy}" + (f" + fsync x{args.fsync}" if args.fsync else "")
    plan = [Load("quiet"), Load(loaded, args.busy, args.fsync)]
    if args.etcd_pause:
        plan.append(Load(f"{loaded}, etcd stalls {args.etcd_pause:g} s", args.busy, args.fsync,
                         args.etcd_pause))
    with tempfile.TemporaryDirectory(prefix="kvgate-new-session-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            await bench.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{bench.ports['ext_proc']}") as ch:
                await bench.bind_sticky(ch)
                for round_ in range(args.rounds):
                    phases = [await bench.phase(ch, load) for load in plan]
                    print(f"round {round_ + 1} (load average {os.getloadavg()[0]:.1f}):")
                    report(phases)
        finally:
            await bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=8, help="busy-loop processes when loaded")
    parser.add_argument("--fsync", type=int, default=0,
                        help="processes also writing and fsyncing a file, when loaded")
    parser.add_argument("--etcd-pause", type=float, default=0.0,
                        help="a third phase: etcd stopped this long (s) every 2 s")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="requests per second, half new sessions, half sticky")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--sticky-sessions", type=int, default=200)
    parser.add_argument("--message-timeout", default="5s",
                        help="ext_proc.message_timeout (the suite's: 5s)")
    args = parser.parse_args()
    if not 0 <= args.etcd_pause < PAUSE_EVERY_S:
        parser.error(f"--etcd-pause: must be 0 or more and below {PAUSE_EVERY_S:g} s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
