"""An engine that Envoy reaches but the control plane's probes do not (a partition between the
control plane and one engine, made here by its /health answering 503 while it serves requests):
the leader marks it failed and moves its sessions, every ext_proc replica follows the binding,
and when the probes pass again nothing moves back. Targets: none failed, no binding lost, no
session whose engines interleave (a session moves once, A then B; that is the failover). The
engine is seen failed by the admin API during the fault and active again after it.

    python -m pytest -m chaos tests/chaos/test_engine_faults.py -s
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.chaos_run import FULL, Scene, recovered, state_of, under_traffic
from tests.support.polling import eventually
from tests.support.upstreams import Upstream

REFUSED_S = 60.0 if FULL else 12.0  # past the probes' verdict (3 misses, 2 s apart)


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_an_engine_the_probes_cannot_reach_loses_its_sessions_once(
        tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]],
        prefix: str) -> None:
    ups = await upstreams(4)
    hidden = ups[0]

    states: list[str] = []

    async def hide(scene: Scene) -> tuple[str, int]:
        await asyncio.sleep(2.0)  # traffic under way first (the schedule, not readiness)
        hidden.probes_refused = True
        started = asyncio.get_running_loop().time()
        states.append(await eventually(lambda: state_of(scene, hidden.address), 30,
                                       until=lambda state: state == "failed",
                                       what="the leader fails the engine its probes miss"))
        await asyncio.sleep(max(0.0, REFUSED_S - (asyncio.get_running_loop().time() - started)))
        hidden.probes_refused = False
        scene.ended()
        states.append(await eventually(lambda: state_of(scene, hidden.address), 30,
                                       until=lambda state: state == "active",
                                       what="the engine back once its probes pass"))
        await asyncio.sleep(3.0)  # traffic after the probes pass again
        return f"one engine's probes refused for {REFUSED_S:g} s", 1

    served_before = hidden.requests
    row = await under_traffic(tmp_path, ups, prefix, hide, failed_over=[hidden.address])
    assert row.faults >= 1 and row.requests > 100 and row.sessions > 20, row
    assert (row.failed, row.cut, row.lost, row.interleaved) == (0, 0, 0, 0), row
    recovered(row)
    assert states == ["failed", "active"]
    assert hidden.requests > served_before  # it served before (and after) the fault

