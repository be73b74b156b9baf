"""Scale benchmark: N session bindings with a real etcd, a control plane and two ext_proc
replicas (real processes, real gRPC), on this machine.

    python -m bench.scale [--bindings 100000] [--out docs/results]

Bindings are made through ext_proc's own gRPC interface as Envoy calls it (the first
`--through-grpc` of them) and the rest written in bulk, on the epoch's leases exactly as
ext_proc writes them. It reports: ext_proc RSS per binding (filled live, loaded at a restart,
and after a relisting); the time for a restarted replica to hold every binding; the slowest
decision seen by a probe sending one every 10 ms to each replica throughout; watch lag between
the replicas (p50/p99); how long `kvgate status` and `endpoints list` take; how long the leader
takes to move a failed engine's sessions; the time to leave degraded mode after etcd stalls;
the batched flush rate; etcd writes per active session per epoch with 1 and 3 replicas.
Targets (issue 13): 1M bindings in <= 350 MB per replica, a restarted replica holds 1M within
20 s with no probe decision slower than 50 ms, watch lag p99 <= 100 ms, <= 1.1 writes per active
session per epoch with 3 replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.scale.etcd_writes import flush_rate, writes_per_epoch
from bench.scale.report import markdown
from bench.scale.system import Bench
from kvgate.runtime.children.child import Child


async def run(args: argparse.Namespace, children: list[Child]) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kvgate-scale-"))
    bench = Bench(args, workdir)
    bench.children = children  # the caller kills what is left if this is interrupted
    say = bench.say
    say(f"scale benchmark: {args.bindings} bindings, workdir {workdir}")
    try:
        await bench.start()
        baseline = [bench.rss(0), bench.rss(1)]
        sessions = await bench.fill()
        started = time.perf_counter()
        await bench.until_held(0)
        await bench.until_held(1)
        bench.results["live_apply_s"] = time.perf_counter() - started
        bench.memory("filled live", baseline)
        probes = await bench.probes(sessions)
        await asyncio.sleep(2)
        windows: dict[str, tuple[float, float]] = {}
        mark = time.time()
        bench.results["restart"] = await bench.restart(1)
        windows["restart of replica 1"] = (mark, time.time())
        bench.results["restart"]["rss_mb"] = round(bench.rss(1) / 2**20)
        say(f"  restart: {bench.results['restart']}")
        bench.memory("after a restart (paged load)", [baseline[0], baseline[1]])
        mark = time.time()
        bench.results["watch_lag"] = await bench.watch_lag()
        windows["watch lag"] = (mark, time.time())
        say(f"  watch lag: {bench.results['watch_lag']}")
        bench.results["admin"] = await bench.admin_times()
        say(f"  admin API: {bench.results['admin']}")
        mark = time.time()
        bench.results["failover"] = await bench.failover()
        windows["failover"] = (mark, time.time())
        say(f"  failover: {bench.results['failover']}")
        mark = time.time()
        bench.results["etcd_stall"] = await bench.etcd_stall(args.stall)
        windows["etcd stall"] = (mark, time.time())
        say(f"  etcd stall: {bench.results['etcd_stall']}")
        mark = time.time()
        bench.results["relist"] = await bench.relist()
        windows["etcd restart (relist)"] = (mark, time.time())
        bench.memory("after a relisting", baseline)
        windows["throughout"] = (0.0, time.time())
        for probe in probes:
            assert probe.stdin is not None
            probe.stdin.close()
            await probe.wait()
        bench.results["probe"] = {f"replica {i}": bench.probe_report(i, windows) for i in (0, 1)}
        assert bench.etcd.pid is not None
        bench.results["flush"] = await flush_rate(bench.etcd_endpoint, bench.etcd.pid,
                                                  "/kvgate/bench-flush/", args.flush)
        say(f"  flush: {bench.results['flush']}")
        bench.results["write_economy"] = [
            await writes_per_epoch(bench.etcd_endpoint, f"/kvgate/bench-writes-{r}/", r,
                                   args.economy_sessions) for r in (1, 3)]
        say(f"  write economy: {bench.results['write_economy']}")
    finally:
        await bench.stop()
    return bench.results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindings", type=int, default=100_000, help="N (default 100,000)")
    parser.add_argument("--through-grpc", type=int, default=2000,
                        help="of them made through ext_proc's gRPC interface (default 2,000)")
    parser.add_argument("--stall", type=float, default=5.0, help="etcd stall, seconds (5)")
    parser.add_argument("--flush", type=int, default=30_000,
                        help="bindings queued for the flush-rate measurement (30,000)")
    parser.add_argument("--economy-sessions", type=int, default=3000,
                        help="active sessions for writes per epoch (3,000)")
    parser.add_argument("--workdir", help="logs and etcd data (default: a temporary dir)")
    parser.add_argument("--out", type=Path, help="write scale-<N>.json and .md here")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="only print the table of an earlier run's scale-<N>.json")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(args.report.read_text())), end="")
        return 0
    if args.bindings < 1000:
        parser.error("--bindings: at least 1000")
    children: list[Child] = []
    try:
        results = asyncio.run(run(args, children))
    except KeyboardInterrupt:
        return 130
    finally:
        for child in children:  # after an interruption: nothing left running
            child.kill()
    text = markdown(results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"scale-{args.bindings}"
        stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
        stem.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
