"""`kvgate up` keeps its children running: one that exits is started again, with the same
command line (its ports, config and data directory), after a backoff
(kvgate.runtime.children.restarts). The others keep serving meanwhile: Envoy keeps its last
config and routes on its ring while ext_proc or the control plane is away; a service's state
comes back from etcd, etcd's from its data directory.

It ends when asked (the `stop` event) or when a child cannot come back: it died again after
the policy's restarts within its window. Restarts are said on screen and counted there (kvgate
up serves no metrics; a child's own counters start again with it).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.runtime.children.child import ChildFailed
from kvgate.runtime.children.restarts import RestartBudget, RestartPolicy
from stack.local import Component, Stack


@dataclass(frozen=True, slots=True)
class GaveUp:
    """A child that could not come back: which, how it last ended, its last log lines."""

    component: Component
    how: str
    restarts: int
    tail: str


def how_it_ended(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class ChildSupervisor:
    """Watches every child of `stack` and restarts each one that ends."""

    def __init__(self, stack: Stack, say: Callable[[str], None],
                 policy: RestartPolicy | None = None) -> None:
        self._stack = stack
        self._say = say
        self.policy = policy or RestartPolicy()
        self.budgets: dict[str, RestartBudget] = {}

    async def run(self, stop: asyncio.Event) -> GaveUp | None:
        """Until `stop` is set (None) or a child cannot come back (why)."""
        watched = [c for c in self._stack.components if c.child is not None and c.probe]
        watchers = [asyncio.create_task(self._watch(c), name=f"watch {c.name}")
                    for c in watched]
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait({*watchers, stopping},
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*watchers, stopping):
                task.cancel()
            await asyncio.gather(*watchers, stopping, return_exceptions=True)
        return next((task.result() for task in watchers if task in done), None)

    async def _watch(self, component: Component) -> GaveUp:
        child = component.child
        assert child is not None
        budget = self.budgets.setdefault(component.name, RestartBudget(self.policy))
        failed: str | None = None  # why the last restart did not come back
        while True:
            code = await child.wait_exit(None) if child.process is not None else None
            how, failed = failed or how_it_ended(code), None
            pause = budget.next_pause()
            if pause is None:
                return GaveUp(component, how, budget.total, child.tail())
            self._say(f"kvgate up: {component.name} {how}; restarting in {pause:g} s (restart "
                      f"{budget.total}; it is given up after {self.policy.describe()})")
            await asyncio.sleep(pause)
            started = asyncio.get_running_loop().time()
            try:
                await self._stack.restart(component)
            except ChildFailed as exc:
                failed = _without_name(str(exc).splitlines()[0], component.name)
                self._say(f"kvgate up: {component.name} did not come back: {failed}")
                await child.stop(grace=2.0)  # hung, or of no use: make it dead
                continue
            took = asyncio.get_running_loop().time() - started
            self._say(f"kvgate up: {component.name} is back (pid {child.pid}, ready in "
                      f"{took:.1f} s)")


def _without_name(reason: str, name: str) -> str:
    """"envoy exited with code 1" -> "exited with code 1" (the name is said before it)."""
    for prefix in (f"{name}: ", f"{name} "):
        if reason.startswith(prefix):
            return reason[len(prefix):]
    return reason
