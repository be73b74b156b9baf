"""Emulated engines on loopback addresses 127.0.0.x, all on one port (what a DNS name's A
records give: addresses, one port), sharing one DDR pool, each its own process so a test can
add and remove them."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import TracebackType

from kvgate.runtime.children.child import Child
from tests.support.ports import free_port


class HostedEngines:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.pool_url = ""
        self.children: dict[str, Child] = {}  # host → its engine (the pool host: "pool")

    async def _start(self, name: str, *args: str) -> dict[str, object]:
        ready = self.workdir / f"{name}.json"
        child = Child(name, [sys.executable, "-m", "emulator", "--instances", "1",
                             "--time-scale", "0", "--log-level", "warning",
                             "--ready-file", str(ready), *args],
                      self.workdir / f"{name}.log")
        self.children[name] = child
        await child.start()

        async def written() -> bool:
            return await asyncio.to_thread(ready.exists)

        await child.wait_ready(written, 60)
        info: dict[str, object] = json.loads(ready.read_text())
        return info

    async def __aenter__(self) -> HostedEngines:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        """The DDR pool's host (an engine on 127.0.0.1 that no test routes to)."""
        info = await self._start("pool", "--port", "0")
        self.pool_url = str(info["pool_url"])

    async def add(self, host: str) -> str:
        """An engine at `host`:port; returns its `ip:port`."""
        await self._start(host, "--host", host, "--port", str(self.port),
                          "--pool-url", self.pool_url)
        return self.address(host)

    def address(self, host: str) -> str:
        return f"{host}:{self.port}"

    async def remove(self, host: str) -> None:
        await self.children.pop(host).stop()

    async def stop(self) -> None:
        for name in [n for n in self.children if n != "pool"] + ["pool"]:
            if name in self.children:
                await self.children.pop(name).stop()
