"""A rolling upgrade under traffic: every component restarted one instance at a time (each ext_proc
replica, the control plane, each etcd member, and Envoy by hot restart), the next one only once the
last is ready again.
The targets: no request failed, no session answered by two engines, no binding lost.

    python -m pytest -m chaos tests/chaos/test_rolling_upgrade.py -s
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kvgate.config.model import HostPort
from kvgate.runtime.children.child import Child
from stack.local import grpc_serving
from tests.support.chaos_run import Scene, holds, under_traffic
from tests.support.upstreams import Upstream

READY_S = 60.0


async def restart(child: Child, serving: HostPort) -> None:
    """Stopped as an orchestrator stops it (SIGTERM, then SIGKILL after the grace), started again
    on the same ports, and waited for."""
    await child.stop()
    await child.start()
    await child.wait_ready(lambda: grpc_serving(serving), READY_S)


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_every_component_restarted_one_at_a_time_loses_nothing(
        tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]],
        prefix: str) -> None:
    async def roll(scene: Scene) -> tuple[str, int]:
        stack = scene.stack
        restarted = 0
        await asyncio.sleep(2.0)  # traffic under way first (the schedule, not readiness)
        for child, address in zip(stack.ext_procs, stack.config.ext_proc.addresses, strict=True):
            await restart(child, address)
            restarted += 1
            await asyncio.sleep(1.0)  # traffic between steps, as a rollout paces itself
        assert stack.control_plane is not None
        await restart(stack.control_plane, stack.config.control_plane.admin)
        restarted += 1
        for member in range(len(scene.cluster.children)):
            await asyncio.sleep(1.0)
            await scene.cluster.stop_member(member)
            await scene.cluster.restart(member)
            restarted += 1
        await asyncio.sleep(1.0)
        await stack.hot_restart_envoy()  # a new Envoy takes the port over; the old one drains
        restarted += 1
        scene.ended()
        await asyncio.sleep(2.0)  # traffic after the last step
        return "every component restarted one at a time", restarted

    row = await under_traffic(tmp_path, await upstreams(4), prefix, roll, hot_restart=True)
    holds(row, 7)
