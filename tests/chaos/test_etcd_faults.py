"""Faults of a three-member etcd under traffic: the leader killed again and again. Every request
is accounted for (tests/support/chaos.py); the targets: none failed, no session answered by two
engines, no binding lost.

Marked `chaos` and deselected from the normal suite while the faults it found are open
(docs/operating.md, "Faults under traffic"). The short run (a kill every 4 s for 16 s):
    python -m pytest -m chaos tests/chaos -s
The full run, a kill every 10 s for two minutes:
    KVGATE_CHAOS=full python -m pytest -m chaos tests/chaos -s
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.chaos import Account, Traffic, account
from tests.support.etcd_cluster import EtcdCluster
from tests.support.polling import eventually
from tests.support.stack import gateway_config, running_stack, stored_bindings
from tests.support.upstreams import Upstream

FULL = os.environ.get("KVGATE_CHAOS") == "full"


def leader_now(cluster: EtcdCluster) -> Callable[[], Awaitable[int]]:
    """The leader's index, -1 while the members elect one (for :func:`eventually`)."""
    async def leader() -> int:
        found = await cluster.leader()
        return -1 if found is None else found
    return leader


def elected(index: int) -> bool:
    return index >= 0


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_the_etcd_leader_killed_again_and_again_loses_nothing(
        tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]],
        prefix: str) -> None:
    every_s, for_s = (10.0, 120.0) if FULL else (4.0, 16.0)
    ups = await upstreams(4)
    loop = asyncio.get_running_loop()
    async with EtcdCluster(tmp_path / "etcd", 3) as cluster:
        config = gateway_config([u.address for u in ups], prefix=prefix,
                                etcd=cluster.endpoints, ext_procs=2)
        async with running_stack(config, tmp_path / "stack") as stack:
            traffic = Traffic(f"http://{stack.config.listener}")
            running = asyncio.create_task(traffic.run())
            kills = 0
            end = loop.time() + for_s
            while loop.time() < end:
                await asyncio.sleep(every_s)  # the fault schedule, not a wait for readiness
                leader = await eventually(leader_now(cluster), until=elected, what="an etcd leader")
                cluster.kill(leader)
                kills += 1
                await cluster.restart(leader)  # back on its data; it rejoins as a follower
            traffic.stop()
            await running
            stopped = loop.time()
            fault = f"etcd leader killed every {every_s:g} s for {for_s:g} s"

            async def settled() -> Account:
                # Bindings placed while etcd elected are written back once it answers again.
                return account(fault, traffic.served,
                               await stored_bindings(cluster.endpoints, prefix), kills)

            def nothing_lost(row: Account) -> bool:
                return row.lost == 0

            try:
                row = await eventually(settled, 30, until=nothing_lost, every=0.5,
                                       what="every binding in etcd")
            finally:
                last = await settled()
                print(f"\n{Account.HEADER}\n{last.row()}\nbindings complete "
                      f"{loop.time() - stopped:.1f} s after the traffic stopped")
    assert kills >= for_s // every_s - 1
    assert row.requests > 100 and row.sessions > 20, row
    assert (row.failed, row.split, row.lost) == (0, 0, 0), row
