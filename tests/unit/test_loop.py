"""The shared event-loop runner."""

from __future__ import annotations

import pytest

from kvgate.runtime.tasks.loop import run


class Result:
    reprs = 0

    def __repr__(self) -> str:
        Result.reprs += 1
        return "Result()"


async def produce() -> Result:
    return Result()


def test_run_returns_the_result_without_ever_formatting_it() -> None:
    # A simulation's result holds millions of figures: formatting it on the way out cost seconds.
    result = run(produce())
    assert isinstance(result, Result) and Result.reprs == 0


async def fail() -> None:
    raise ValueError("from the coroutine")


def test_run_raises_what_the_coroutine_raised() -> None:
    with pytest.raises(ValueError, match="from the coroutine"):
        run(fail())
