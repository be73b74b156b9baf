"""Gateway benchmark: the same traffic through Envoy + ext_proc (kvgate) and through Envoy's
ring_hash alone, in one run, on this machine. Prints latency and max rate, and their ratios.

    python bench/gateway_bench.py [--duration 8] [--sessions 1000] [--replicas 1,2]
                                  [--transports grpc,http] [--rounds 3] [--gate off,on]
                                  [--body-bytes 0] [--spread-only]

Needs `wrk` (Debian: apt-get install wrk), except `--spread-only`: each kvgate run's warm-up alone
(one request per session, no wrk), and each replica's share of its decisions. Upstreams are a
separate Envoy answering with a direct response, so the engines never limit the measurement.
Figures are for known sessions (a warm-up binds every session first), which is the hot path kvgate
is built for. Every mode's stack runs for the whole benchmark and the rounds go through the modes
in turn, so a machine shared with other work loads each mode alike; each figure is the median over
the rounds, each ratio the median of the rounds' own ratios to ring_hash.

`--gate off,on` measures each run with the load gate off and on. On, ext_proc scrapes the
upstreams' /metrics (they have none) and books every request with a body on its engine, priced
as instant so no backlog builds: the gate's cost on sticky requests under its threshold, not its
moves. `--body-bytes N` sends each request as a POST of N bytes (text, so Envoy reads no session
from it), which gives it the `content-length` the gate sizes prompts by; 0 (default): GET.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgate.config import Config, load_text
from kvgate.config.model import HostPort
from kvgate.contract.modes import RoutingMode
from kvgate.runtime.children.child import Child
from kvgate.runtime.children.envoy import envoy_binary, envoy_ready
from kvgate.runtime.children.ports import free_ports
from stack.local import Stack

LUA = """
local n = 0
local sessions = {sessions}
local body = {body}
request = function()
  n = n + 1
  if body == "" then
    return wrk.format("GET", "/v1/bench", {{["x-session-id"] = "bench-" .. (n % sessions)}})
  end
  return wrk.format("POST", "/v1/bench", {{["x-session-id"] = "bench-" .. (n % sessions),
                                           ["content-type"] = "text/plain"}}, body)
end
"""


def upstream_bootstrap(ports: list[int], admin: int) -> dict[str, object]:
    """An Envoy that answers 200 on every port: upstreams far faster than the gateway."""
    def listener(port: int) -> dict[str, object]:
        return {
            "name": f"up{port}",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network."
                             "http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "up",
                    "route_config": {"virtual_hosts": [{
                        "name": "all", "domains": ["*"],
                        "routes": [{"match": {"prefix": "/"},
                                    "direct_response": {"status": 200, "body": {
                                        "inline_string": json.dumps({"upstream": port})}}}],
                    }]},
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": {"@type": "type.googleapis.com/"
                                         "envoy.extensions.filters.http.router.v3.Router"},
                    }],
                },
            }]}],
        }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {"listeners": [listener(p) for p in ports]},
    }


def gateway_config(upstreams: list[int], replicas: int, transport: str = "grpc",
                   gate: bool = False) -> Config:
    ports = iter(free_ports(5 + replicas))
    text = json.dumps({
        "listener": {"port": next(ports)},
        "envoy_admin": {"port": next(ports)},
        "control_plane": {"xds": f"127.0.0.1:{next(ports)}", "admin": f"127.0.0.1:{next(ports)}"},
        "ext_proc": {"address": [f"127.0.0.1:{next(ports)}" for _ in range(replicas)],
                     "metrics": f"127.0.0.1:{next(ports)}", "transport": transport},
        "pools": [{"name": "bench", "endpoints": [f"127.0.0.1:{p}" for p in upstreams]}],
        # Not an inference path: the default routes would not serve it.
        "routes": [{"match": {"path": "/v1/bench"}, "pool": "bench"}],
        # Instant engines: the gate books every sized request, but no backlog ever builds.
        "placement": {"load_gate": {"enabled": gate},
                      "engine_cost": {"prefill_tokens_per_s": 1e9, "prefill_overhead_s": 0}},
    })
    return load_text(text)


def wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
         "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout
    def latency(pct: str) -> float:
        match = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert match, out
        return float(match[1]) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match[2]]
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    assert rate, out
    return {"p50": latency("50"), "p99": latency("99"), "rps": float(rate[1]),
            "non2xx": float(errors[1]) if errors else 0.0}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def decisions(stack: Stack) -> list[float]:
    """Decisions so far, per replica (each has its own metrics port)."""
    counts = []
    async with httpx.AsyncClient() as http:
        for metrics in stack.ext_proc_metrics:
            text = (await http.get(f"http://{metrics}/metrics")).text
            counts.append(sum(float(v) for v in re.findall(
                r"^kvgate_ext_proc_decisions_total\{.*\} (\S+)$", text, re.M)))
    return counts


async def warm_up(stack: Stack, sessions: int) -> None:
    """Binds every session: what the rounds measure is the hot path."""
    async with httpx.AsyncClient(base_url=f"http://{stack.config.listener}") as http:
        for n in range(sessions):
            reply = await http.get("/v1/bench", headers={"x-session-id": f"bench-{n}"})
            assert reply.status_code == 200, reply.text


async def measure(stack: Stack, script: Path, args: argparse.Namespace) -> dict[str, float]:
    url = f"http://{stack.config.listener}"
    low = await asyncio.to_thread(wrk, url, script, 1, args.duration / 2)
    pids = [c.pid for c in stack.ext_procs if c.pid]
    cpu_before = sum(cpu_seconds(p) for p in pids)
    decided_before = await decisions(stack)
    high = await asyncio.to_thread(wrk, url, script, args.connections, args.duration)
    result = {"p50": low["p50"], "p99": low["p99"], "rps": high["rps"],
              "loaded_p50": high["p50"], "loaded_p99": high["p99"],
              "errors": low["non2xx"] + high["non2xx"]}
    if pids:
        # Every replica's decisions over every replica's CPU (not the first's over all).
        cpu = sum(cpu_seconds(p) for p in pids) - cpu_before
        decided = [after - before
                   for after, before in zip(await decisions(stack), decided_before, strict=True)]
        result["decisions_per_cpu_s"] = sum(decided) / cpu
        result["ext_proc_cpu_share"] = cpu / args.duration
        # How evenly Envoy spread the decisions: the busiest replica's share.
        result["busiest_replica_share"] = max(decided) / max(1.0, sum(decided))
    return result


async def main(args: argparse.Namespace) -> None:
    if args.spread_only:
        await spread(args)
        return
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install wrk")
    work = Path(tempfile.mkdtemp(prefix="kvgate-bench-"))
    script = work / "sessions.lua"
    script.write_text(LUA.format(sessions=args.sessions, body=json.dumps("x" * args.body_bytes)))
    *ports, upstream_admin = free_ports(5)
    (work / "upstreams.json").write_text(json.dumps(upstream_bootstrap(ports, upstream_admin)))
    upstream = Child("upstreams", [envoy_binary(), "-c", str(work / "upstreams.json"),
                                    "--concurrency", "1", "--disable-hot-restart",
                                    "--log-level", "error"], work / "upstreams.log")
    await upstream.start()
    await upstream.wait_ready(lambda: envoy_ready(HostPort("127.0.0.1", upstream_admin)), 30)
    rounds: dict[str, list[dict[str, float]]] = {}
    stacks: list[Stack] = []
    try:
        runs = [("ring_hash (Envoy alone)", RoutingMode.RING_HASH, 1, "grpc", False)]
        runs += [(f"kvgate {t}, {n} ext_proc" + (f", gate {g}" if len(args.gate) > 1 else ""),
                  RoutingMode.AFFINITY, n, t, g == "on")
                 for t in args.transports for n in args.replicas for g in args.gate]
        for name, mode, replicas, transport, gate in runs:
            config = gateway_config(ports, replicas, transport, gate)
            stack = Stack(config, work / name.replace(" ", "_"), mode=mode)
            stacks.append(stack)
            await stack.start()
            await warm_up(stack, args.sessions)
            rounds[name] = []
        for round_ in range(args.rounds):
            for (name, *_), stack in zip(runs, stacks, strict=True):
                rounds[name].append(await measure(stack, script, args))
                print(f"round {round_ + 1}/{args.rounds}: measured {name}", file=sys.stderr)
    finally:
        for stack in reversed(stacks):
            await stack.stop()
        await upstream.stop()
    report(rounds)


async def spread(args: argparse.Namespace) -> None:
    """Each kvgate run's warm-up (one request per session): each replica's share of the
    decisions, which is how Envoy spreads sessions over the replicas."""
    work = Path(tempfile.mkdtemp(prefix="kvgate-spread-"))
    *ports, upstream_admin = free_ports(5)
    (work / "upstreams.json").write_text(json.dumps(upstream_bootstrap(ports, upstream_admin)))
    upstream = Child("upstreams", [envoy_binary(), "-c", str(work / "upstreams.json"),
                                    "--concurrency", "1", "--disable-hot-restart",
                                    "--log-level", "error"], work / "upstreams.log")
    await upstream.start()
    try:
        await upstream.wait_ready(lambda: envoy_ready(HostPort("127.0.0.1", upstream_admin)), 30)
        for transport in args.transports:
            for replicas in args.replicas:
                name = f"kvgate {transport}, {replicas} ext_proc"
                stack = Stack(gateway_config(ports, replicas, transport),
                              work / name.replace(" ", "_"), mode=RoutingMode.AFFINITY)
                await stack.start()
                try:
                    await warm_up(stack, args.sessions)
                    decided = await decisions(stack)
                finally:
                    await stack.stop()
                shares = ", ".join(f"{d / max(1.0, sum(decided)):.1%}" for d in decided)
                print(f"{name}: {args.sessions} sessions, each replica's share: {shares}")
    finally:
        await upstream.stop()


def report(rounds: dict[str, list[dict[str, float]]]) -> None:
    """Medians over the rounds; ratios and added latency against ring_hash in the same round."""
    base = rounds["ring_hash (Envoy alone)"]

    def median(values: list[float]) -> float:
        return statistics.median(values)

    count = len(base)
    print(f"median of {count} round{'s' if count > 1 else ''}")
    print(f"{'mode':<37}{'p50 ms':>9}{'p99 ms':>9}{'max req/s':>11}{'x base':>8}"
          f"{'added p50':>11}{'decisions/ext_proc CPU-s':>26}{'busiest replica':>17}")
    for name, runs in rounds.items():
        per_cpu = [r["decisions_per_cpu_s"] for r in runs if "decisions_per_cpu_s" in r]
        busiest = [r["busiest_replica_share"] for r in runs if "busiest_replica_share" in r]
        ratio = median([r["rps"] / b["rps"] for r, b in zip(runs, base, strict=True)])
        added = median([r["p50"] - b["p50"] for r, b in zip(runs, base, strict=True)])
        print(f"{name:<37}{median([r['p50'] for r in runs]) * 1e3:>9.3f}"
              f"{median([r['p99'] for r in runs]) * 1e3:>9.3f}"
              f"{median([r['rps'] for r in runs]):>11.0f}{ratio:>8.2f}{added * 1e3:>9.3f}ms"
              f"{f'{median(per_cpu):,.0f}' if per_cpu else '':>26}"
              f"{f'{max(busiest):.0%}' if busiest else '':>17}")
    if count > 1:
        for name, runs in rounds.items():
            per_cpu = [r["decisions_per_cpu_s"] for r in runs if "decisions_per_cpu_s" in r]
            if per_cpu:
                print(f"  {name}: decisions per CPU-second by round: "
                      + ", ".join(f"{v:,.0f}" for v in per_cpu))
    errors = sum(r["errors"] for runs in rounds.values() for r in runs)
    print(f"non-2xx responses: {errors:.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 2])
    parser.add_argument("--transports", type=lambda s: s.split(","), default=["grpc", "http"],
                        help="ext_proc transports to measure, comma separated (grpc, http)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every mode this many times, in turn; report the medians")
    parser.add_argument("--body-bytes", type=int, default=0,
                        help="POST a body of this many bytes (0: GET) (%(default)s)")
    parser.add_argument("--gate", type=lambda s: s.split(","), default=["off"],
                        help="the load gate in each run: off, on, or off,on (%(default)s)")
    parser.add_argument("--spread-only", action="store_true",
                        help="no wrk: each replica's share of one request per session")
    asyncio.run(main(parser.parse_args()))

