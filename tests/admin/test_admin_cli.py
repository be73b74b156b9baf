"""The CLI round-trips every command through a real AdminServer onto a real etcd."""

from __future__ import annotations

import json
import time

from kvgate.bindings.model import Binding
from kvgate.endpoints import EndpointRecord
from kvgate.endpoints.records import record_key
from tests.admin.admin_helpers import (
    SESSION_A,
    SESSION_B,
    SESSION_C,
    SESSION_C_RAW,
    Fleet,
    StartServer,
    run_cli,
)
from tests.support.ports import free_port


async def record(fleet: Fleet, pool: str, address: str) -> EndpointRecord:
    kv = await fleet.client.get(record_key(fleet.prefix, pool, address))
    assert kv is not None
    return EndpointRecord.decode(pool, address, kv.value)


async def bound_to(fleet: Fleet, pool: str, session: str) -> str:
    kv = await fleet.client.get(f"{fleet.prefix}bindings/{pool}/{session}".encode())
    assert kv is not None
    return Binding.decode(f"{pool}/{session}", kv.value, kv.mod_revision).endpoint


async def test_endpoints_commands(fleet: Fleet, admin_server: StartServer) -> None:
    server = await admin_server()
    admin = f"127.0.0.1:{server.port}"

    listed = await run_cli("endpoints", "list", admin=admin)
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    assert lines[0].split()[:6] == ["POOL", "ENDPOINT", "KV_POOL", "ROLE", "STATE", "SESSIONS"]
    busy = next(line for line in lines if "10.0.0.11:8000" in line).split()
    assert busy[:6] == ["coder", "10.0.0.11:8000", "memcache-a", "both", "active", "2"]
    # A prefill/decode pool's engines say what they do.
    assert next(line for line in lines if "10.0.1.1:8000" in line).split()[3] == "decode"
    assert next(line for line in lines if "10.0.1.2:8000" in line).split()[3] == "prefill"
    assert "25.0%" in busy and "50.0%" in busy  # hit rate and KV usage from the load provider
    assert any("10.0.1.1:8000" in line for line in lines)

    as_json = await run_cli("endpoints", "list", "--pool", "coder", "--json", admin=admin)
    assert as_json.code == 0, as_json.err
    rows = {row["address"]: row for row in json.loads(as_json.out)}
    assert set(rows) == {"10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000"}
    assert rows["10.0.0.11:8000"]["sessions"] == 2
    assert rows["10.0.0.11:8000"]["load"]["hit_rate"] == 0.25
    assert rows["10.0.0.13:8000"]["kv_pool"] == "memcache-b"
    assert rows["10.0.0.13:8000"]["role"] == "both"
    assert rows["10.0.0.12:8000"]["load"]["running"] is None

    before = time.time()
    drained = await run_cli("endpoints", "drain", "10.0.0.12:8000", "--deadline", "10m",
                            admin=admin)
    assert drained.code == 0, drained.err
    assert "coder 10.0.0.12:8000: draining" in drained.out and "sessions move at" in drained.out
    now = await record(fleet, "coder", "10.0.0.12:8000")
    assert now.admin == "draining" and now.state == "draining"
    assert now.drain_deadline is not None
    assert before + 600 - 1 <= now.drain_deadline <= time.time() + 600 + 1

    undrained = await run_cli("endpoints", "undrain", "10.0.0.12:8000", "--pool", "coder",
                              admin=admin)
    assert undrained.code == 0, undrained.err
    assert "coder 10.0.0.12:8000: active" in undrained.out
    now = await record(fleet, "coder", "10.0.0.12:8000")
    assert (now.admin, now.drain_deadline) == ("active", None)

    failed = await run_cli("endpoints", "fail", "10.0.0.13:8000", "--json", admin=admin)
    assert failed.code == 0, failed.err
    assert json.loads(failed.out)["state"] == "failed"
    assert (await record(fleet, "coder", "10.0.0.13:8000")).admin == "failed"

    unknown = await run_cli("endpoints", "drain", "10.9.9.9:8000", admin=admin)
    assert unknown.code == 1
    assert unknown.err.startswith("kvgate: ") and "10.9.9.9:8000" in unknown.err
    assert len(unknown.err.strip().splitlines()) == 1

    bad_deadline = await run_cli("endpoints", "drain", "10.0.0.12:8000", "--deadline", "soon",
                                 admin=admin)
    assert bad_deadline.code == 2 and "--deadline" in bad_deadline.err
    assert (await record(fleet, "coder", "10.0.0.12:8000")).admin == "active"


async def test_sessions_and_status_commands(fleet: Fleet, admin_server: StartServer) -> None:
    server = await admin_server()
    admin = f"127.0.0.1:{server.port}"

    listed = await run_cli("sessions", "list", "--json", admin=admin)
    assert listed.code == 0, listed.err
    found = {(s["pool"], s["session"]): s["endpoint"] for s in json.loads(listed.out)}
    assert found == {("coder", SESSION_A): "10.0.0.11:8000", ("coder", SESSION_B): "10.0.0.11:8000",
                     ("chat", SESSION_C): "10.0.1.1:8000"}

    on_endpoint = await run_cli("sessions", "list", "--endpoint", "10.0.1.1:8000", admin=admin)
    assert on_endpoint.code == 0, on_endpoint.err
    assert SESSION_C in on_endpoint.out and SESSION_A not in on_endpoint.out
    limited = await run_cli("sessions", "list", "--limit", "1", "--json", admin=admin)
    assert len(json.loads(limited.out)) == 1

    shown = await run_cli("sessions", "show", SESSION_C_RAW, admin=admin)
    assert shown.code == 0, shown.err
    row = next(line for line in shown.out.splitlines() if SESSION_C in line).split()
    assert row[:3] == ["chat", SESSION_C, "10.0.1.1:8000"]

    moved = await run_cli("sessions", "move", SESSION_A, "10.0.0.12:8000", admin=admin)
    assert moved.code == 0, moved.err
    assert moved.out.strip() == f"session {SESSION_A} in coder now on 10.0.0.12:8000"
    assert await bound_to(fleet, "coder", SESSION_A) == "10.0.0.12:8000"
    assert await bound_to(fleet, "coder", SESSION_B) == "10.0.0.11:8000"

    # Only to active endpoints: the server's reason reaches the operator verbatim.
    await fleet.client.put(  # mark it failed directly, as the health checker would
        f"{fleet.prefix}endpoints/coder/10.0.0.13:8000".encode(),
        b'{"state": "failed", "admin": "active", "healthy": false, "kv_pool": "memcache-b"}')
    refused = await run_cli("sessions", "move", SESSION_B, "10.0.0.13:8000", "--json",
                            admin=admin)
    assert refused.code == 1
    assert "sessions only move to active endpoints" in refused.err
    assert await bound_to(fleet, "coder", SESSION_B) == "10.0.0.11:8000"

    missing = await run_cli("sessions", "show", "nobody", admin=admin)
    assert missing.code == 1 and "no binding for session 'nobody'" in missing.err

    status = await run_cli("status", admin=admin)
    assert status.code == 0, status.err
    assert "cp-1  (leader)" in status.out and "v7" in status.out
    assert "envoy-a" in status.out and "Listener=v7" in status.out
    assert "2× last v6: bad listener" in status.out
    assert "10.0.0.13:8000" in status.out and "failing health checks" in status.out

    as_json = await run_cli("status", "--json", admin=admin)
    data = json.loads(as_json.out)
    assert data["leader"] == "cp-1" and data["endpoints_error"] is None
    assert data["nodes"][0]["acked"] == {
        "type.googleapis.com/envoy.config.listener.v3.Listener": "v7"}
    assert data["nodes"][0]["last_nack"] == "bad listener"
    states = {(e["pool"], e["address"]): (e["state"], e["sessions"]) for e in data["endpoints"]}
    assert states[("coder", "10.0.0.12:8000")] == ("active", 1)
    assert states[("coder", "10.0.0.13:8000")] == ("failed", 0)
    assert states[("chat", "10.0.1.1:8000")] == ("active", 1)


async def test_unreachable_admin_api() -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    result = await run_cli("endpoints", "list", admin=nowhere)
    assert result.code == 3
    assert f"cannot reach the admin API at {nowhere}" in result.err
    assert len(result.err.strip().splitlines()) == 1
    usage = await run_cli("status", "--admin", "not-an-address", admin=nowhere)
    assert usage.code == 2 and "--admin" in usage.err
