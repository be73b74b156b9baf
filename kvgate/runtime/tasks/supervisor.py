"""One supervisor per service: every long-lived background task runs under it, so none dies
silently.

A task that raises is logged with its reason (an etcd error names its kind), counted in
`kvgate_task_restarts_total{service,task}` and restarted after a capped exponential backoff with
jitter; a task that has run `healthy_after` seconds since its last restart starts its backoff
afresh and is no longer reported as failing. The supervisor holds a reference to every task and
stops them all (cancel, then await) on shutdown.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter

from kvgate.etcd.errors import EtcdError

log = structlog.get_logger("kvgate.supervisor")


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """A task that failed recently and has not run healthily since (what `kvgate status` shows)."""

    task: str
    restarts: int  # restarts since the service started
    error: str  # the last failure's reason, e.g. "RuntimeError: boom" or "etcd no_space: ..."
    failed_at: float  # unix time of the last failure


@dataclass(slots=True)
class _Record:
    restarts: int = 0
    in_a_row: int = 0
    error: str = ""
    failed_at: float = 0.0  # unix time
    restarted: float = 0.0  # loop time the task was (or will be) started again


def describe(exc: BaseException) -> str:
    """A failure's reason in one line: the etcd kind for etcd errors, else type and message."""
    if isinstance(exc, EtcdError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Supervisor:
    """Runs, restarts and stops the background tasks of one service (`service` labels metrics)."""

    def __init__(
        self,
        service: str,
        registry: CollectorRegistry,
        *,
        initial_backoff: float = 0.2,
        max_backoff: float = 30.0,
        healthy_after: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self.service = service
        self._initial = initial_backoff
        self._max = max_backoff
        self._healthy_after = healthy_after
        self._rng = rng or random.Random()
        self._restarts = Counter(
            "kvgate_task_restarts", "Background tasks restarted after an unexpected failure",
            ["service", "task"], registry=registry,
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._all: set[asyncio.Task[None]] = set()  # strong references until each task is done
        self._records: dict[str, _Record] = {}

    # -- running ------------------------------------------------------------------------------

    def spawn(
        self, name: str, run: Callable[[], Awaitable[None]], *, once: bool = False
    ) -> asyncio.Task[None]:
        """Runs `run()` as task `name`, again after every failure.

        A long-lived task (the default) that returns is restarted too: it was meant to run until
        cancelled. With `once`, a normal return ends it; only failures are retried.
        """
        if name in self._tasks:
            raise ValueError(f"task {name!r} is already running under {self.service}")
        task = asyncio.create_task(self._guard(name, run, once), name=f"{self.service}:{name}")
        self._tasks[name] = task
        self._all.add(task)
        task.add_done_callback(lambda done: self._done(name, done))
        return task

    def cancel(self, name: str) -> asyncio.Task[None] | None:
        """Cancels task `name` without waiting; returns it (await it to be sure it ended)."""
        task = self._tasks.pop(name, None)
        self._records.pop(name, None)
        if task is not None:
            task.cancel()
        return task

    async def stop(self, names: Iterable[str] | None = None) -> None:
        """Cancels the named tasks (default: all of them) and waits until they have ended."""
        chosen = list(self._tasks) if names is None else [n for n in names if n in self._tasks]
        stopped = [t for t in (self.cancel(name) for name in chosen) if t is not None]
        if names is None:
            stopped.extend(t for t in self._all if not t.done())
            for task in stopped:
                task.cancel()
        await asyncio.gather(*stopped, return_exceptions=True)

    def running(self) -> list[str]:
        return sorted(self._tasks)

    def failing(self) -> list[TaskFailure]:
        """Tasks that failed and have not yet run `healthy_after` seconds since their restart."""
        now = asyncio.get_running_loop().time()
        return [
            TaskFailure(name, r.restarts, r.error, r.failed_at)
            for name, r in sorted(self._records.items())
            if r.in_a_row and now - r.restarted < self._healthy_after
        ]

    def restarts(self, name: str) -> int:
        record = self._records.get(name)
        return 0 if record is None else record.restarts

    # -- internals ----------------------------------------------------------------------------

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        self._all.discard(task)
        if self._tasks.get(name) is task:
            del self._tasks[name]

    def backoff(self, attempt: int) -> float:
        """Seconds before restart number `attempt` (1, 2, ...) in a row: capped exponential,
        with jitter so replicas that failed together do not retry together."""
        ceiling = min(self._max, self._initial * 2.0 ** min(attempt - 1, 30))
        return ceiling * self._rng.uniform(0.5, 1.0)

    async def _guard(self, name: str, run: Callable[[], Awaitable[None]], once: bool) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            failure: BaseException | None
            try:
                await run()
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # stopped: by the supervisor, or by the loop's shutdown
                # Cancelled from within (a future it awaited was cancelled under it, e.g. a
                # gRPC call on a closed channel) while nobody stopped it: a failure, not an end.
                failure = exc
                reason = "CancelledError: a call it awaited was cancelled under it"
            except Exception as exc:  # whatever it was, the task must come back
                failure = exc
                reason = describe(exc)
            else:
                if once:
                    self._records.pop(name, None)
                    return
                failure, reason = None, "returned (it should run until stopped)"
            record = self._records.setdefault(name, _Record())
            if loop.time() - started >= self._healthy_after:
                record.in_a_row = 0  # it had recovered: start the backoff afresh
            record.in_a_row += 1
            record.restarts += 1
            record.error = reason
            record.failed_at = time.time()
            delay = self.backoff(record.in_a_row)
            record.restarted = loop.time() + delay
            self._restarts.labels(self.service, name).inc()
            log.error(
                "task_failed", service=self.service, task=name, error=reason,
                kind=str(failure.kind) if isinstance(failure, EtcdError) else None,
                restarts=record.restarts, restart_in_s=round(delay, 3),
                exc_info=failure if failure is not None and not isinstance(failure, EtcdError)
                else None,
            )
            await asyncio.sleep(delay)
            log.info("task_restarted", service=self.service, task=name, restarts=record.restarts)
