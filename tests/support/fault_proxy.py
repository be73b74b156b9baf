"""A network partition between one component and one address, under the test's control: a TCP
proxy on a free loopback port that forwards both ways until :meth:`FaultProxy.cut`, then holds
every byte and every new connection (as a network that drops packets does: nothing is refused,
nothing arrives; the peers' deadlines and keepalives find out) until :meth:`FaultProxy.heal`.
``cut(reset=True)`` is the other kind of partition: every connection reset at once, and each new
one reset as soon as it is made."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection


class FaultProxy:
    def __init__(self, target: str, avoid: Collection[int] = ()) -> None:
        """`avoid`: ports promised to others, released for now (a config's free ports): the
        OS may hand one out again, and the proxy must not take it."""
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._avoid = set(avoid)
        self._open = asyncio.Event()
        self._open.set()
        self._reset = False
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self.address = ""

    async def start(self) -> None:
        while True:
            server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            if port not in self._avoid:
                break
            server.close()  # a port the stack is about to listen on: take another
            await server.wait_closed()
        self._server = server
        self.address = f"127.0.0.1:{port}"

    def cut(self, *, reset: bool = False) -> None:
        self._open.clear()
        self._reset = reset
        if reset:
            for pump in list(self._pumps):
                pump.cancel()

    def heal(self) -> None:
        self._reset = False
        self._open.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._forward(reader, writer))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._reset:
            writer.close()
            return
        try:
            await self._open.wait()  # a connection made across a cut waits, as a SYN would
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await self._open.wait()  # held, not dropped: TCP would retransmit it
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
