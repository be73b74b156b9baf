"""Running a component's main coroutine on the fastest event loop available."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop where it is installed (not on Windows), else on asyncio's own."""
    result: list[T] = []

    async def keep_result_off_the_task() -> None:
        # On the way out, Python 3.11's signal.getsignal() reprs the finished main task, result
        # included: seconds for a simulation's results. The task's own result stays None.
        result.append(await main)

    try:
        import uvloop
    except ImportError:
        asyncio.run(keep_result_off_the_task())
    else:
        uvloop.run(keep_result_off_the_task())
    return result[0]
