"""What the scale benchmark reads of a replica (its Prometheus page, its memory), and the
polling that times how long a condition takes to hold."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp


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
