"""The supervisor on its own: restart, backoff, counting, reporting, stopping."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kvgate.etcd.errors import EtcdNoSpace
from kvgate.runtime.tasks.supervisor import Supervisor
from tests.support.polling import eventually


def _restarts(registry: CollectorRegistry, task: str) -> float:
    value = registry.get_sample_value("kvgate_task_restarts_total",
                                      {"service": "test", "task": task})
    return value or 0.0


def _supervisor(registry: CollectorRegistry, **kwargs: float) -> Supervisor:
    kwargs.setdefault("initial_backoff", 0.01)
    return Supervisor("test", registry, rng=random.Random(1), **kwargs)


def _failing(times: int, fail: Callable[[], Awaitable[None]]
             ) -> tuple[Callable[[], Awaitable[None]], list[int], asyncio.Event]:
    """A task that fails `times` runs in a row by `fail()`, then runs until stopped: the task,
    its runs, and an event set once it runs healthily."""
    runs: list[int] = []
    recovered = asyncio.Event()

    async def work() -> None:
        runs.append(1)
        if len(runs) <= times:
            await fail()
        recovered.set()
        await asyncio.Event().wait()

    return work, runs, recovered


@pytest.mark.parametrize("error", [RuntimeError("boom"), RecursionError("too deep"),
                                   KeyError("missing")])
async def test_a_task_that_raises_is_logged_counted_and_restarted(error: Exception) -> None:
    registry = CollectorRegistry()
    supervisor = _supervisor(registry)

    async def fail() -> None:
        raise error

    work, _, recovered = _failing(2, fail)
    with capture_logs() as logs:
        supervisor.spawn("worker", work)
        await asyncio.wait_for(recovered.wait(), 5)
    failures = [e for e in logs if e["event"] == "task_failed"]
    assert len(failures) == 2
    assert failures[0]["task"] == "worker" and failures[0]["service"] == "test"
    assert type(error).__name__ in failures[0]["error"]
    assert failures[0]["exc_info"] is error  # the traceback goes to the log
    assert _restarts(registry, "worker") == 2
    [failing] = supervisor.failing()
    assert failing.task == "worker" and failing.restarts == 2
    assert type(error).__name__ in failing.error
    assert supervisor.running() == ["worker"]
    await supervisor.stop()
    assert supervisor.running() == []


async def test_an_etcd_error_is_named_by_its_kind() -> None:
    registry = CollectorRegistry()
    supervisor = _supervisor(registry)
    calls = 0

    async def work() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise EtcdNoSpace("etcdserver: mvcc: database space exceeded", operation="Put")
        await asyncio.Event().wait()

    with capture_logs() as logs:
        supervisor.spawn("writer", work)
        await eventually(lambda: calls == 2)
    [failure] = [e for e in logs if e["event"] == "task_failed"]
    assert failure["kind"] == "no_space"
    assert "no_space" in failure["error"] and "database space exceeded" in failure["error"]
    await supervisor.stop()


async def test_a_long_lived_task_that_returns_is_restarted_a_one_shot_is_not() -> None:
    registry = CollectorRegistry()
    supervisor = _supervisor(registry)
    runs = {"loop": 0, "once": 0}

    async def loop() -> None:
        runs["loop"] += 1
        if runs["loop"] < 3:
            return
        await asyncio.Event().wait()

    async def once() -> None:
        runs["once"] += 1
        if runs["once"] == 1:
            raise RuntimeError("first try fails")

    supervisor.spawn("loop", loop)
    supervisor.spawn("once", once, once=True)
    await eventually(lambda: runs["loop"] == 3 and runs["once"] == 2)
    await eventually(lambda: supervisor.running() == ["loop"])  # the one-shot is done
    assert _restarts(registry, "loop") == 2 and _restarts(registry, "once") == 1
    assert [f.task for f in supervisor.failing()] == ["loop"]  # a finished one-shot is not failing
    assert "returned" in supervisor.failing()[0].error
    await supervisor.stop()


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    supervisor = Supervisor("test", CollectorRegistry(), initial_backoff=0.2, max_backoff=5.0,
                            rng=random.Random(7))
    delays = [supervisor.backoff(n) for n in range(1, 12)]
    ceilings = [min(5.0, 0.2 * 2 ** (n - 1)) for n in range(1, 12)]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 5.0
    assert len({round(d / c, 6) for d, c in zip(delays, ceilings, strict=True)}) > 1  # jittered
    assert supervisor.backoff(10_000) <= 5.0  # no overflow however long it keeps failing


async def test_a_task_that_ran_healthily_is_no_longer_failing() -> None:
    registry = CollectorRegistry()
    supervisor = _supervisor(registry, healthy_after=0.3)
    calls = 0

    async def work() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("once")
        await asyncio.Event().wait()

    supervisor.spawn("worker", work)
    await eventually(lambda: calls == 2)
    assert [f.task for f in supervisor.failing()] == ["worker"]
    await eventually(lambda: supervisor.failing() == [], within=5)
    assert supervisor.restarts("worker") == 1  # the count stays
    await supervisor.stop()


async def test_stop_cancels_and_awaits_every_task_and_names_are_unique() -> None:
    supervisor = _supervisor(CollectorRegistry())
    started: list[str] = []
    ended: list[str] = []

    async def work(name: str) -> None:
        started.append(name)
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    for name in ("a", "b", "c"):
        supervisor.spawn(name, lambda n=name: work(n))
    with pytest.raises(ValueError, match="already running"):
        supervisor.spawn("a", lambda: work("again"))
    await eventually(lambda: len(started) == 3)
    await supervisor.stop(["b"])
    assert ended == ["b"] and supervisor.running() == ["a", "c"]
    await supervisor.stop()
    assert sorted(ended) == ["a", "b", "c"] and supervisor.running() == []


async def test_a_task_cancelled_from_within_is_restarted_a_stopped_one_is_not() -> None:
    """A future the task awaited cancelled under it (a gRPC call on a channel a failover closed)
    ends the task with CancelledError though nobody stopped it: without a restart the task is
    gone for good, silently (the degraded-mode flush once was)."""
    registry = CollectorRegistry()
    supervisor = _supervisor(registry)

    async def cancelled_under_it() -> None:
        call = asyncio.get_running_loop().create_future()
        call.cancel()  # what closing a channel does to a call in flight
        await call

    work, runs, recovered = _failing(1, cancelled_under_it)
    with capture_logs() as logs:
        supervisor.spawn("flush", work)
        await asyncio.wait_for(recovered.wait(), 5)
    [failure] = [e for e in logs if e["event"] == "task_failed"]
    assert failure["task"] == "flush" and "CancelledError" in failure["error"]
    assert _restarts(registry, "flush") == 1
    await supervisor.stop()
    assert supervisor.running() == [] and len(runs) == 2  # stopping it did not restart it
