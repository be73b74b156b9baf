"""The scale benchmark's 10 ms probe of a replica's decisions, run as its own process so that
the benchmark's own work never delays it: `python -m bench.scale.probe ADDRESS POOL SESSIONS
OUT EVERY`."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import grpc

from bench.scale.decisions import Decisions


async def probe(address: str, pool: str, known: list[str], out: Path, every: float) -> None:
    """A decision every `every` seconds (known sessions, and one new one in ten) until stdin
    closes; one JSON line per decision: [unix time, seconds taken or null, error, new session].
    A new session's decision includes its etcd write (up to ext_proc's 100 ms deadline); a known
    one's is memory only, so it shows any stall of the replica's event loop."""
    decisions = Decisions(address, pool)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), stop.set)
    with out.open("w") as sink:
        i = 0
        next_at = loop.time()
        while not stop.is_set():
            session = f"probe-new-{i}" if i % 10 == 0 else known[i % len(known)]
            started = time.perf_counter()
            try:
                await decisions.decide(session, limit_s=1.0)
                sink.write(json.dumps([time.time(), time.perf_counter() - started, None,
                                       i % 10 == 0]) + "\n")
            except (grpc.aio.AioRpcError, ConnectionError) as exc:
                code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "closed"
                sink.write(json.dumps([time.time(), None, code, i % 10 == 0]) + "\n")
            sink.flush()
            i += 1
            next_at += every
            await asyncio.sleep(max(0.0, next_at - loop.time()))
    await decisions.close()


if __name__ == "__main__":
    address, pool, sessions, out, every = sys.argv[1:6]
    asyncio.run(probe(address, pool, Path(sessions).read_text().split(), Path(out), float(every)))
