"""Pieces of the scale benchmark (bench/scale.py): ext_proc asked as Envoy asks it, engines that
only answer health probes, a replica's metrics and memory, and the 10 ms probe (run as its own
process, so the benchmark's own work never delays it: `python -m bench.scale_parts probe ...`)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from kvgate.contract.envoy import DESTINATION_KEY, LB_NAMESPACE, POOL_METADATA_KEY

HEADER = "x-session-id"


class Decisions:
    """ext_proc's gRPC interface as Envoy uses it: one Process stream per request, the session
    header in the request headers, the route's pool in the stream's metadata."""

    def __init__(self, address: str, pool: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.ExternalProcessorStub(self._channel)
        self._metadata = ((POOL_METADATA_KEY, pool),)

    async def close(self) -> None:
        await self._channel.close()

    async def decide(self, session: str, limit_s: float = 2.0) -> str:
        """The endpoint(s) ext_proc picked ('' when it left the request to Envoy's ring)."""
        request = pb.ProcessingRequest(request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(
                key=HEADER, raw_value=session.encode())]),
            end_of_stream=True))
        call = self._stub.Process(metadata=self._metadata, timeout=limit_s)
        try:
            await call.write(request)
            reply = await call.read()
            await call.done_writing()
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            raise ConnectionError("ext_proc closed the stream without answering")
        lb = reply.dynamic_metadata.fields.get(LB_NAMESPACE)
        return "" if lb is None else lb.struct_value.fields[DESTINATION_KEY].string_value


class Engines:
    """Endpoints that answer the control plane's health probes (and nothing else): what the
    benchmark measures never reaches an engine."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def nothing(request: web.Request) -> web.Response:
            return web.Response(text="")

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", nothing)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for port in self.ports:
            await web.TCPSite(self._runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """A Prometheus text page as {'name{labels}': value}."""
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as reply:
        text = await reply.text()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def until(check: Callable[[], Awaitable[bool] | bool], every: float = 0.05) -> None:
    """Polls `check` until it holds (the benchmark measures how long that takes)."""
    while True:
        held = check()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        await asyncio.sleep(every)


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


if __name__ == "__main__" and sys.argv[1:2] == ["probe"]:
    address, pool, sessions, out, every = sys.argv[2:7]
    asyncio.run(probe(address, pool, Path(sessions).read_text().split(), Path(out), float(every)))
