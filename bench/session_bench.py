"""What finding the session in the body costs: latency and Envoy CPU per request, in one run.

    python bench/session_bench.py [--sizes 4096,65536,524288] [--rounds 20] [--block 50]

Two gateways (Envoy + ext_proc + etcd) in front of the same upstreams (a separate Envoy
answering at once, so no engine limits the figures):
- `off`: kvgate without body reading (`session.body_fields: []`, `session.implicit: off`),
  the session in the `x-session-id` header: what kvgate cost before;
- `on`: the defaults, driven three ways: the id in the header (the body filters are skipped),
  in the body (`prompt_cache_key`: json_to_metadata reads it), and nowhere (json_to_metadata
  finds nothing, then the Lua filter computes the implicit key).
Chat-completions bodies of each size (a system prompt and a first user message padded to the
size), 100 known sessions. Blocks of requests alternate between the four ways, round after
round, so the machine's noise falls on all of them alike; one connection, one request at a time
(latency at low load). Envoy CPU per request is the gateway Envoy's CPU time over a block
divided by its requests (the `on` Envoy serves three of the ways, one block at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.gateway_bench import upstream_bootstrap
from kvgate.config import Config, load_text
from kvgate.config.model import HostPort
from kvgate.contract.modes import RoutingMode
from kvgate.runtime.children.child import Child
from kvgate.runtime.children.envoy import envoy_binary, envoy_ready
from kvgate.runtime.children.ports import free_ports
from stack.local import Stack

SESSIONS = 100
WAYS = ("off: header", "on: header", "on: body key", "on: no id (implicit)")


def config_for(upstreams: list[int], body: bool) -> Config:
    ports = iter(free_ports(6))
    config = load_text(json.dumps({
        "listener": {"port": next(ports)},
        "envoy_admin": {"port": next(ports)},
        "control_plane": {"xds": f"127.0.0.1:{next(ports)}", "admin": f"127.0.0.1:{next(ports)}"},
        "ext_proc": {"address": f"127.0.0.1:{next(ports)}", "metrics": f"127.0.0.1:{next(ports)}"},
        "pools": [{"name": "bench", "endpoints": [f"127.0.0.1:{p}" for p in upstreams]}],
    }))
    if body:
        return config
    return replace(config, session=replace(config.session, body_fields=(), implicit=False))


def chat_body(size: int, conversation: int, key: str | None) -> bytes:
    """A chat request of about `size` bytes: a shared system prompt, then a first user message
    of the conversation's own (its start names the conversation)."""
    system = "You are the bank's code assistant. Answer with code. " * 20
    question = f"Conversation {conversation}: review this file.\n"
    user = {"role": "user", "content": question}
    body: dict[str, object] = {"model": "m", "messages": [
        {"role": "system", "content": system}, user], "max_tokens": 64, "stream": True}
    if key is not None:
        body["prompt_cache_key"] = key
    padding = max(0, size - len(json.dumps(body)))
    user["content"] = question + "x = call(y)  # \"step\"\n" * (padding // 24 + 1)
    return json.dumps(body).encode()


def request_bytes(gateway: HostPort, body: bytes, session: str | None) -> bytes:
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {gateway}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
    if session is not None:
        head += f"x-session-id: {session}\r\n"
    return head.encode() + b"\r\n" + body


class Connection:
    """One keep-alive HTTP/1.1 connection sending prepared requests (little client overhead)."""

    def __init__(self, address: HostPort) -> None:
        self.address = address
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.address.host,
                                                                 self.address.port)

    async def send(self, request: bytes) -> float:
        assert self.reader is not None and self.writer is not None
        started = time.perf_counter()
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"HTTP {status} from {self.address}")
        return elapsed

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_size(size: int, stacks: dict[str, Stack],
                       args: argparse.Namespace) -> dict[str, dict[str, float]]:
    off, on = stacks["off"].config.listener, stacks["on"].config.listener
    prepared = {
        "off: header": [request_bytes(off, chat_body(size, i, None), f"s{i}")
                        for i in range(SESSIONS)],
        "on: header": [request_bytes(on, chat_body(size, i, None), f"s{i}")
                       for i in range(SESSIONS)],
        "on: body key": [request_bytes(on, chat_body(size, i, f"s{i}"), None)
                         for i in range(SESSIONS)],
        "on: no id (implicit)": [request_bytes(on, chat_body(size, i, None), None)
                                 for i in range(SESSIONS)],
    }
    connections = {way: Connection(off if way.startswith("off") else on) for way in WAYS}
    envoy_pids: dict[str, int] = {}
    for way in WAYS:
        envoy = stacks["off" if way.startswith("off") else "on"].envoy
        assert envoy is not None and envoy.pid is not None, "the stacks are started"
        envoy_pids[way] = envoy.pid
    latencies: dict[str, list[float]] = {way: [] for way in WAYS}
    cpu: dict[str, float] = dict.fromkeys(WAYS, 0.0)
    for connection in connections.values():
        await connection.open()
    try:
        for way in WAYS:  # warm-up: bind every session
            for request in prepared[way]:
                await connections[way].send(request)
        for round_ in range(args.rounds):
            for way in WAYS if round_ % 2 == 0 else reversed(WAYS):
                pid = envoy_pids[way]
                before = cpu_seconds(pid)
                for n in range(args.block):
                    request = prepared[way][(round_ * args.block + n) % SESSIONS]
                    latencies[way].append(await connections[way].send(request))
                cpu[way] += cpu_seconds(pid) - before
    finally:
        for connection in connections.values():
            await connection.close()
    requests = args.rounds * args.block
    return {way: {"p50": statistics.median(values),
                  "p90": statistics.quantiles(values, n=10)[-1],
                  "p99": statistics.quantiles(values, n=100)[-1],
                  "envoy_cpu": cpu[way] / requests}
            for way, values in latencies.items()}


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="kvgate-session-bench-"))
    *ports, upstream_admin = free_ports(5)
    (work / "upstreams.json").write_text(json.dumps(upstream_bootstrap(ports, upstream_admin)))
    upstream = Child("upstreams", [envoy_binary(), "-c", str(work / "upstreams.json"),
                                    "--concurrency", "1", "--disable-hot-restart",
                                    "--log-level", "error"], work / "upstreams.log")
    stacks = {name: Stack(config_for(ports, name == "on"), work / name, envoy_workers=1,
                          mode=RoutingMode.AFFINITY) for name in ("off", "on")}
    await upstream.start()
    try:
        await upstream.wait_ready(lambda: envoy_ready(HostPort("127.0.0.1", upstream_admin)), 30)
        for stack in stacks.values():
            await stack.start()
        results = {}
        for size in args.sizes:
            results[size] = await measure_size(size, stacks, args)
            print(f"measured {size} B bodies", file=sys.stderr)
    finally:
        for stack in stacks.values():
            await stack.stop()
        await upstream.stop()
    report(results, args)


def report(results: dict[int, dict[str, dict[str, float]]], args: argparse.Namespace) -> None:
    print(f"{args.rounds} rounds x {args.block} requests per way and size; one connection")
    print(f"{'body':>8}  {'session':<22}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}"
          f"{'added p50':>11}{'x p50':>7}{'Envoy CPU µs/req':>18}")
    for size, ways in results.items():
        base = ways["off: header"]
        for way, r in ways.items():
            print(f"{_size(size):>8}  {way:<22}{r['p50'] * 1e3:>8.3f}{r['p90'] * 1e3:>8.3f}"
                  f"{r['p99'] * 1e3:>8.3f}{(r['p50'] - base['p50']) * 1e3:>9.3f}ms"
                  f"{r['p50'] / base['p50']:>7.2f}{r['envoy_cpu'] * 1e6:>18.0f}")


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[4096, 65536, 524288])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
