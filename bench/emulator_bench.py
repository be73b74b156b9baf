"""Emulator benchmark: requests/s of one instance at --time-scale 0, and DDR pool memory.

    python bench/emulator_bench.py [--seconds 5] [--concurrency 32] [--blocks 1000000]

The server under test runs in its own process (``python -m emulator``); this process is the load
generator (aiohttp, keep-alive connections). The same client against a trivial aiohttp "hello"
server, measured in the same run, gives a baseline: the ratio shows how much of the ceiling is
the client and the machine rather than the emulator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: `emulator` is imported from the tree


def serve_baseline(port_file: Path) -> None:
    """Child process: a trivial aiohttp handler returning a small JSON body."""

    async def hello(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", hello)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]  # the port the OS chose for port 0
        payload = json.dumps({"engines": [f"127.0.0.1:{port}"]})
        await asyncio.to_thread(port_file.write_text, payload)
        await asyncio.Event().wait()

    try:
        import uvloop  # same loop as the emulator, for a fair baseline

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def start(cmd: list[str], ready: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start: {cmd}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["engines"][0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(
    engine: str, seconds: float, concurrency: int, stream: bool, pid: int
) -> tuple[int, float, float]:
    """Closed-loop load: ``concurrency`` workers, each sending the next request on reply.

    Returns (requests, wall seconds, server CPU seconds) over the measured window.
    """
    url = f"http://{engine}/v1/chat/completions"
    stop_at = 0.0
    done = 0

    async def worker(session: aiohttp.ClientSession, wid: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop_at:
            body = {
                "messages": [{"role": "user", "content": f"session {wid} turn {i}: hi there"}],
                "max_tokens": 16,
                "stream": stream,
            }
            async with session.post(url, json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"status {resp.status}")
            done += 1
            i += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop_at = time.perf_counter() + 0.5  # warm-up: connections, memo tables
        await asyncio.gather(*(worker(session, w) for w in range(concurrency)))
        done = 0
        cpu0 = cpu_seconds(pid)
        start_t = time.perf_counter()
        stop_at = start_t + seconds
        await asyncio.gather(*(worker(session, w) for w in range(concurrency)))
        elapsed = time.perf_counter() - start_t
        cpu = cpu_seconds(pid) - cpu0
    return done, elapsed, cpu


def measure(cmd: list[str], args: argparse.Namespace, stream: bool = False) -> tuple[float, float]:
    """(requests/s, requests per server CPU-second) of one server process under load."""
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        proc, engine = start([*cmd, str(ready)], ready)
        try:
            done, elapsed, cpu = asyncio.run(
                load(engine, args.seconds, args.concurrency, stream, proc.pid)
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return done / elapsed, done / max(cpu, 1e-9)


def pool_memory(blocks: int) -> tuple[float, float]:
    """(tracemalloc MB, RSS delta MB) of a DdrPool holding ``blocks`` random 64-bit hashes."""
    from emulator.ddr_pool import DdrPool

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    rng = random.Random(1)
    hashes = [rng.getrandbits(64) for _ in range(blocks)]
    rss0 = rss_mb()
    tracemalloc.start()
    pool = DdrPool(capacity_tokens=blocks * 16, block_size=16)
    for i in range(0, blocks, 10_000):
        pool.insert(hashes[i : i + 10_000])
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(pool) == blocks
    # The hash ints are shared with `hashes`; count them as the pool's own (it owns them in use).
    int_bytes = sum(sys.getsizeof(h) for h in hashes[:1000]) / 1000 * blocks
    return (traced + int_bytes) / 1e6, rss_mb() - rss0 + int_bytes / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--serve-baseline", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(args.serve_baseline)
        return 0
    emulator = [sys.executable, "-m", "emulator", "--instances", "1", "--time-scale", "0",
                "--log-level", "warning", "--ready-file"]  # fmt: skip
    baseline = [sys.executable, __file__, "--serve-baseline"]
    print(f"cpus: {os.cpu_count()}  python: {sys.version.split()[0]}  load: {args.concurrency} "
          f"connections x {args.seconds:.0f} s, chat, max_tokens=16")  # fmt: skip
    print("server                            req/s   req per server CPU-s   vs baseline")
    base, base_cpu = measure(baseline, args)
    print(f"baseline aiohttp hello handler  {base:7.0f}   {base_cpu:20.0f}")
    for label, stream in (("emulator, non-streaming", False), ("emulator, streaming (SSE)", True)):
        rate, per_cpu = measure(emulator, args, stream=stream)
        print(f"{label:<30}  {rate:7.0f}   {per_cpu:20.0f}   {per_cpu / base_cpu:10.0%}")
    traced, rss = pool_memory(args.blocks)
    print(f"DDR pool, {args.blocks:,} blocks:     {traced:8.1f} MB traced, {rss:.1f} MB RSS delta")
    return 0


if __name__ == "__main__":
    sys.exit(main())
