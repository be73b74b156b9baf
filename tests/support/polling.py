"""Waiting with a deadline (never a bare sleep standing in for readiness), and routing probes."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

import httpx


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], within: float = 10.0
) -> None:
    """Polls `check` (plain or async) until it holds; fails the test if it does not within
    `within` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def homes_of(http: httpx.AsyncClient, sessions: list[str]) -> dict[str, str]:
    """Where each session's next request lands (test upstreams answer with their address)."""
    found = {}
    for session in sessions:
        reply = await http.get("/v1/chat", headers={"x-session-id": session})
        assert reply.status_code == 200, reply.text
        found[session] = reply.json()["upstream"]
    return found
