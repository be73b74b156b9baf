"""An emulated fleet, one process per engine, sharing one DDR pool, so a test can kill one."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from kvgate.runtime.children.child import Child


class EngineProcesses:
    def __init__(self, count: int, workdir: Path, *extra: str,
                 roles: tuple[str, ...] = ()) -> None:
        self.count = count
        self.workdir = workdir
        self.extra = extra
        self.roles = roles  # one `kvgate emulate --role` per engine (default: both)
        self.children: list[Child] = []
        self.engines: list[str] = []
        self.pool_url: str | None = None

    async def start(self) -> None:
        # Process 0 hosts the DDR pool and is not one of the engines, so killing any engine
        # leaves the pool (a separate service in production) alive.
        for index in range(self.count + 1):
            ready = self.workdir / f"engine-{index}.json"
            joining = ("--pool-url", self.pool_url) if self.pool_url else ()
            child = Child(f"engine-{index}", [
                sys.executable, "-m", "emulator", "--instances", "1", "--port", "0",
                "--time-scale", "0", "--log-level", "warning", "--ready-file", str(ready),
                *joining, *self.extra,
                *(("--role", self.roles[index - 1]) if index and self.roles else ()),
            ], self.workdir / f"engine-{index}.log")
            self.children.append(child)
            await child.start()

            async def written(path: Path = ready) -> bool:
                return await asyncio.to_thread(path.exists)

            await child.wait_ready(written, 60)
            info = json.loads(ready.read_text())
            if index:
                self.engines.append(info["engines"][0])
            self.pool_url = self.pool_url or info["pool_url"]

    def child_of(self, engine: str) -> Child:
        return self.children[1 + self.engines.index(engine)]

    async def stop(self) -> None:
        for child in reversed(self.children):
            await child.stop()
