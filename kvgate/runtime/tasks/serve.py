"""Run a service until SIGINT/SIGTERM: start (or report why not), wait, stop with grace."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import Protocol


class Service(Protocol):
    """What every kvgate service offers its runner."""

    async def start(self) -> None: ...

    async def stop(self, grace: float = ...) -> None: ...


async def serve_until_signalled(
    service: Service, name: str, on_hangup: Callable[[], None] | None = None
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if on_hangup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
    try:
        await service.start()
    except Exception as exc:  # one clear line, then undo whatever did start
        print(f"{name}: {exc}", file=sys.stderr)
        await service.stop(grace=0)
        return 1
    await stop.wait()
    await service.stop()
    return 0
