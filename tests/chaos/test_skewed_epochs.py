"""Replicas whose wall clocks are seconds apart, across idle-expiry epochs. Epochs are numbered
from the wall clock (kvgate.bindings.leases), so near every boundary two replicas off by seconds
disagree on the epoch: the one ahead grants the next epoch's shared leases early, the one behind
re-attaches the sessions it served late. A lease lives the idle TTL plus two epochs from its
grant, so a session is kept its idle TTL while the replicas' clocks are less than an epoch
(idle_ttl / 4) apart (docs/operating.md). The target, for clocks two seconds apart: no binding
expires while its session is in use (within the idle TTL of its last turn), and the usual ones
(none failed, cut, split or lost).

    python -m pytest -m chaos tests/chaos/test_skewed_epochs.py -s
    KVGATE_CLOCKS=4,-3 ...: other offsets (these are seven seconds apart, past an epoch of 3 s)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kvgate.etcd import EtcdClient, EtcdError
from kvgate.session import normalize_session
from tests.support.chaos import Traffic
from tests.support.chaos_run import FULL, Scene, holds, skewed, under_traffic
from tests.support.upstreams import Upstream

IDLE_TTL_S = 12.0  # epochs of 3 s: the replicas below are more than two epochs apart
AHEAD, BEHIND = (float(s) for s in os.environ.get("KVGATE_CLOCKS", "1,-1").split(","))
CLOCKS = {"ext_proc[0]": AHEAD, "ext_proc[1]": BEHIND}
RUN_S = 120.0 if FULL else 36.0  # long enough for the first sessions' bindings to expire


async def _deletions(client: EtcdClient, prefix: str, into: list[tuple[str, float]]) -> None:
    """Each binding etcd deletes (its lease expired), with when it was seen."""
    _, revision = await client.get_prefix(prefix.encode())
    async for events, _ in client.watch_prefix(prefix.encode(), revision + 1):
        now = time.monotonic()
        into.extend((e.kv.key.decode().rsplit("/", 1)[1], now) for e in events if e.deleted)


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_replicas_seconds_apart_expire_no_binding_in_use(
        tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]],
        prefix: str) -> None:
    deleted: list[tuple[str, float]] = []
    traffics: list[Traffic] = []

    def traffic(url: str) -> Traffic:  # conversations that span two or three epochs each
        traffics.append(Traffic(url, turns=20, think_s=0.25))
        return traffics[-1]

    async def over_epochs(scene: Scene) -> tuple[str, int]:
        client = EtcdClient(scene.cluster.endpoints)
        watching = asyncio.create_task(_deletions(client, f"{prefix}bindings/", deleted))
        try:
            await asyncio.sleep(RUN_S)  # the schedule: epochs pass under traffic
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, EtcdError):
                await watching
            await client.close()
        epochs = int(RUN_S // (IDLE_TTL_S / 4))
        return (f"replicas' clocks {CLOCKS['ext_proc[0]']:+g} s and {CLOCKS['ext_proc[1]']:+g} s, "
                f"{epochs} epochs of {IDLE_TTL_S / 4:g} s"), epochs

    row = await under_traffic(tmp_path, await upstreams(4), prefix, over_epochs,
                              traffic=traffic, idle_ttl_s=IDLE_TTL_S,
                              env_for={name: skewed(s) for name, s in CLOCKS.items()})
    holds(row, 1)
    starts: dict[str, list[float]] = {}
    for served in traffics[0].served:
        key = normalize_session(served.session.encode())
        if key is not None:
            starts.setdefault(key, []).append(served.start)
    # How long after its session's last turn (before the deletion) each binding went.
    idle = [at - max(t for t in starts[key] if t <= at) for key, at in deleted
            if key in starts and any(t <= at for t in starts[key])]
    assert idle, "no binding of these sessions expired: the run crossed no expiry"
    print(f"{len(idle)} bindings expired {min(idle):.1f}-{max(idle):.1f} s after their "
          f"session's last turn (idle TTL {IDLE_TTL_S:g} s)")
    assert min(idle) >= IDLE_TTL_S, sorted(idle)[:10]
