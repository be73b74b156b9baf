"""Two control planes under traffic; the leader cut from etcd (every byte held, then delivered
when the partition heals, as a network that drops and then recovers does) while its peer
reaches etcd. The peer takes the lead within the election's lease; meanwhile one engine's probes
fail and then pass again, and the new leader fails it and brings it back. When the partition
heals, whatever the old leader had sent is delivered late; the engine stays active, and the
old leader follows. (Its own writes are fenced by its election key's lease, kvgate/etcd/records.py
`Fence`, tested in tests/failsafe/test_deposed_leader.py; here it steps down at its keep-alive's
deadline before its probes reach a verdict.) Targets: none failed, no binding lost, no session
whose engines interleave.

    python -m pytest -m chaos tests/chaos/test_control_plane_takeover.py -s
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.config.model import HostPort
from kvgate.runtime.children.child import Child
from stack.local import grpc_serving
from tests.support.chaos_run import Scene, recovered, state_of, under_traffic
from tests.support.polling import eventually
from tests.support.ports import free_ports
from tests.support.upstreams import Upstream

PEER = "control-plane-2"


async def leader_seen_by(admin: HostPort) -> str:
    async with grpc.aio.insecure_channel(str(admin)) as channel:
        status = await admin_pb2_grpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=10)
    return status.leader if status.HasField("leader") else ""


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_the_leader_cut_from_etcd_hands_over_and_cannot_undo_its_successor(
        tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]],
        prefix: str) -> None:
    ups = await upstreams(4)
    hidden = ups[0]
    seen: list[str] = []

    async def take_over(scene: Scene) -> tuple[str, int]:
        stack = scene.stack
        admin, xds = (HostPort("127.0.0.1", p) for p in free_ports(2))
        config = stack.workdir / "kvgate.effective.yaml"
        peer = Child(PEER, [
            sys.executable, "-m", "control_plane", "-c", str(config),
            "--etcd", ",".join(scene.cluster.endpoints), "--admin", str(admin), "--xds", str(xds),
            "--identity", PEER], tmp_path / f"{PEER}.log")
        await peer.start()
        try:
            await peer.wait_ready(lambda: grpc_serving(admin), 60)
            first = await eventually(lambda: leader_seen_by(admin),
                                     until=lambda name: name not in ("", PEER),
                                     what="the peer follows the first control plane")
            scene.cut("control-plane")
            seen.append(await eventually(lambda: leader_seen_by(admin), 30,
                                         until=lambda name: name == PEER,
                                         what="the peer takes the lead"))
            hidden.probes_refused = True
            seen.append(await eventually(lambda: state_of(scene, hidden.address, admin), 30,
                                         until=lambda s: s == "failed",
                                         what="the new leader fails the engine"))
            hidden.probes_refused = False
            seen.append(await eventually(lambda: state_of(scene, hidden.address, admin), 30,
                                         until=lambda s: s == "active",
                                         what="the new leader brings it back"))
            scene.heal("control-plane")  # what the old leader sent arrives now
            scene.ended()
            seen.append(await eventually(lambda: leader_seen_by(stack.config.control_plane.admin),
                                         30, until=lambda name: name == PEER,
                                         what="the old leader follows"))
            for _ in range(10):  # a late write from the old leader would show here
                seen.append(await state_of(scene, hidden.address, admin))
                await asyncio.sleep(0.5)
            return f"control-plane leader ({first}) cut from etcd, its peer leads", 1
        finally:
            await peer.stop()

    row = await under_traffic(tmp_path, ups, prefix, take_over, partitioned=["control-plane"],
                              failed_over=[hidden.address])
    assert row.faults >= 1 and row.requests > 100 and row.sessions > 20, row
    assert (row.failed, row.cut, row.lost, row.interleaved) == (0, 0, 0, 0), row
    recovered(row)
    assert seen == [PEER, "failed", "active", PEER] + ["active"] * 10, seen
