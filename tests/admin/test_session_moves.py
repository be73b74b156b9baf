"""The control plane records and counts the sessions it moves: `kvgate sessions move` (manual)
and the leader's failover (failed, drained), on a real etcd; `sessions show` says so."""

from __future__ import annotations

import json
import time
from collections import Counter

from control_plane.failover import Failover
from control_plane.operations import Operations
from kvgate.bindings.model import Binding
from kvgate.contract.states import MoveReason
from kvgate.endpoints import EndpointDirectory, EndpointRecord
from tests.admin.admin_helpers import SESSION_A, SESSION_B, Fleet, StartServer, run_cli


async def test_manual_and_failover_moves_are_recorded_and_counted(
        fleet: Fleet, admin_server: StartServer) -> None:
    counted: Counter[MoveReason] = Counter()

    def moved(reason: MoveReason, count: int) -> None:
        counted[reason] += count

    before = time.time()
    operations = Operations(fleet.client, fleet.prefix, on_moved=moved)
    shown = await operations.move_session(SESSION_A, "10.0.0.12:8000")
    assert (shown.binding.move_reason, counted) == (MoveReason.MANUAL, {MoveReason.MANUAL: 1})
    stored = await fleet.client.get(f"{fleet.prefix}bindings/coder/{SESSION_A}".encode())
    assert stored is not None
    record = json.loads(stored.value)
    assert record["endpoint"] == "10.0.0.12:8000" and record["reason"] == "manual"
    assert before - 0.001 <= record["moved_at"] <= time.time()

    # The leader fails 10.0.0.11:8000 (SESSION_B's engine): the failover moves it, reason failed.
    directory = EndpointDirectory(fleet.config)
    for address, kv_pool in (("10.0.0.12:8000", "memcache-a"), ("10.0.0.13:8000", "memcache-b")):
        directory.set_record(EndpointRecord("coder", address, kv_pool))
    directory.set_record(EndpointRecord("coder", "10.0.0.11:8000", "memcache-a", healthy=False))
    assert await Failover(fleet.client, directory, fleet.prefix, 4.0, on_moved=moved).sweep() == 1
    assert counted == {MoveReason.MANUAL: 1, MoveReason.FAILED: 1}
    kv = await fleet.client.get(f"{fleet.prefix}bindings/coder/{SESSION_B}".encode())
    assert kv is not None
    failed_over = Binding.decode(f"coder/{SESSION_B}", kv.value, kv.mod_revision)
    assert failed_over.move_reason is MoveReason.FAILED and failed_over.moved_at >= before - 0.001

    # Removed from the pool (not failed): its sessions move as drained.
    directory.set_record(EndpointRecord("coder", "10.0.0.11:8000", "memcache-a"))
    await fleet.client.put(f"{fleet.prefix}bindings/coder/{SESSION_B}".encode(),
                           b'{"endpoint": "10.0.0.99:8000"}')
    assert await Failover(fleet.client, directory, fleet.prefix, 4.0, on_moved=moved).sweep() == 1
    assert counted[MoveReason.DRAINED] == 1

    server = await admin_server()
    show = await run_cli("sessions", "show", SESSION_A, admin=f"127.0.0.1:{server.port}")
    assert show.code == 0, show.err
    assert "LAST MOVED" in show.out and "manual, " in show.out, show.out
    as_json = await run_cli("sessions", "show", SESSION_A, "--json",
                            admin=f"127.0.0.1:{server.port}")
    assert json.loads(as_json.out)[0]["move_reason"] == "manual"
