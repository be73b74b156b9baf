"""Waiting with a deadline (never a bare sleep standing in for readiness), and routing probes.

Every wait in the tests goes through :func:`eventually` (or :func:`eventually_sync` in a test
that has no event loop). The default deadline is generous on purpose: it bounds how long a
broken test hangs, it is not a performance claim, and a 2-core machine shared with other work
can stall any process for seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import httpx

T = TypeVar("T")

WITHIN = 30.0  # seconds: generous, see above
EVERY = 0.05  # seconds between polls


def _truthy(value: object) -> bool:
    return bool(value)


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    within: float = WITHIN,
    *,
    until: Callable[[T], bool] = _truthy,
    what: str = "condition",
    every: float = EVERY,
) -> T:
    """Calls `check` (sync or async) until `until(result)` holds, and returns that result.

    Fails the test, showing `what` and the last result, if it does not hold within `within`
    seconds. `until` defaults to the result's truth, so `check` may be a plain predicate.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = check()
        value = cast(T, await result) if inspect.isawaitable(result) else result
        if until(value):
            return value
        assert loop.time() < deadline, f"{what}: not met within {within:g} s; last: {value!r}"
        await asyncio.sleep(every)


def eventually_sync(
    check: Callable[[], T],
    within: float = WITHIN,
    *,
    until: Callable[[T], bool] = _truthy,
    what: str = "condition",
    every: float = EVERY,
) -> T:
    """:func:`eventually` for a test without an event loop."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if until(value):
            return value
        assert time.monotonic() < deadline, f"{what}: not met within {within:g} s; last: {value!r}"
        time.sleep(every)


async def homes_of(http: httpx.AsyncClient, sessions: list[str]) -> dict[str, str]:
    """Where each session's next request lands (test upstreams answer with their address)."""
    found = {}
    for session in sessions:
        reply = await http.get("/v1/chat", headers={"x-session-id": session})
        assert reply.status_code == 200, reply.text
        found[session] = reply.json()["upstream"]
    return found
