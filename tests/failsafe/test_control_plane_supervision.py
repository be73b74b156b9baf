"""Every background task of the control plane survives an unexpected exception: it is logged,
counted in kvgate_task_restarts_total{service,task}, restarted, and does its job again.
A real etcd, real probes over HTTP, an in-process control plane."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import control_plane.service
from control_plane.health.scrape import LoadTracker
from control_plane.service import ControlPlaneService
from kvgate.bindings.model import Binding
from kvgate.config import Config
from kvgate.endpoints import sync_membership
from kvgate.endpoints.records import EndpointRecord, record_key
from kvgate.etcd import EtcdClient
from tests.admin.admin_helpers import run_cli
from tests.failsafe.failsafe_helpers import (
    control_plane_config,
    fail_once,
    restarts,
    running_control_plane,
    with_endpoints,
    write_config,
)
from tests.support.polling import eventually
from tests.support.upstreams import Upstream


@dataclass
class Plane:
    service: ControlPlaneService
    upstreams: list[Upstream]
    client: EtcdClient
    config: Config
    path: Path
    prefix: str

    def restarts(self, task: str) -> float:
        return restarts(self.service.registry, "control_plane", task)

    async def record(self, address: str) -> EndpointRecord | None:
        kv = await self.client.get(record_key(self.prefix, "coder", address))
        return None if kv is None else EndpointRecord.decode("coder", address, kv.value)


@pytest.fixture
async def plane(etcd, prefix: str, tmp_path: Path, upstreams) -> AsyncIterator[Plane]:
    ups = await upstreams(2)
    config = control_plane_config([u.address for u in ups], etcd.endpoint, prefix)
    path = write_config(tmp_path / "kvgate.yaml", config)
    client = EtcdClient([etcd.endpoint])
    try:
        async with running_control_plane(config, path) as service:
            await eventually(lambda: service.leader.leading)
            yield Plane(service, ups, client, config, path, prefix)
    finally:
        await client.close()


def _failed(logs: list[dict], task: str, error: str) -> bool:
    return any(e["event"] == "task_failed" and e["task"] == task and error in e["error"]
               for e in logs)


async def test_reload_recovers_from_a_recursion_error_and_applies_the_next_file(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, upstreams
) -> None:
    [third] = await upstreams(1)
    fail_once(monkeypatch, control_plane.service, "load_file",
              RecursionError("maximum recursion depth exceeded"))
    with capture_logs() as logs:
        plane.service.request_reload()
        await eventually(lambda: plane.restarts("reload") == 1)
    assert _failed(logs, "reload", "RecursionError")
    addresses = [u.address for u in plane.upstreams] + [third.address]
    write_config(plane.path, with_endpoints(plane.config, addresses))
    plane.service.request_reload()
    await eventually(lambda: third.address in plane.service.directory.states()["coder"])
    assert await plane.record(third.address) is not None


async def test_endpoints_mirror_recovers(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_once(monkeypatch, plane.service.directory, "apply", RuntimeError("bad event"))
    drained = plane.upstreams[0].address
    with capture_logs() as logs:
        await plane.service.operations.drain(drained, None, None)
        await eventually(lambda: plane.restarts("endpoints-mirror") == 1)
    assert _failed(logs, "endpoints-mirror", "RuntimeError: bad event")
    await eventually(lambda: plane.service.directory.states()["coder"][drained] == "draining")


async def test_membership_mirror_recovers(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, upstreams
) -> None:
    fail_once(monkeypatch, plane.service.membership, "apply", RuntimeError("bad membership"))
    [third] = await upstreams(1)
    newer = with_endpoints(plane.config, [u.address for u in plane.upstreams] + [third.address])
    await sync_membership(plane.client, newer, "another-replica", claim=True)
    await eventually(lambda: plane.restarts("membership-mirror") == 1)
    await eventually(lambda: plane.service.status().membership_generation == 2)
    warning = plane.service.status().membership_warning
    assert warning is not None and "another-replica" in warning  # its file is now the stale one


async def test_leader_election_recovers(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_once(monkeypatch, plane.service.leader, "_round", RuntimeError("election bug"))
    await eventually(lambda: plane.restarts("leader-election") == 1)
    await eventually(lambda: plane.service.leader.leading)
    holder = await plane.client.get(f"{plane.prefix}leader".encode())
    assert holder is not None and holder.value == b"cp-test"


async def test_snapshot_loop_recovers(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plane.service.cache.current is not None
    before = plane.service.cache.current.version
    fail_once(monkeypatch, plane.service, "_publish", RuntimeError("snapshot bug"))
    await plane.service.operations.drain(plane.upstreams[1].address, None, None)
    await eventually(lambda: plane.restarts("snapshot") == 1)
    await eventually(lambda: plane.service.cache.current.version != before)  # type: ignore[union-attr]


async def test_failover_recovers(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = (u.address for u in plane.upstreams)
    fail_once(monkeypatch, plane.service.failover, "sweep", RuntimeError("sweep bug"))
    await eventually(lambda: plane.restarts("failover") == 1)
    binding = Binding("s-2", "coder", a)
    key = f"{plane.prefix}bindings/{binding.key}".encode()
    await plane.client.put(key, binding.encode())
    await plane.service.operations.fail(a, None)

    async def moved() -> bool:
        kv = await plane.client.get(key)
        return kv is not None and Binding.decode(binding.key, kv.value, 0).endpoint == b

    await eventually(moved)


async def test_probe_recovers_and_still_marks_a_dead_engine(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_once(monkeypatch, plane.service.checker, "_probe", RuntimeError("probe bug"))
    tasks = [f"probe:coder/{u.address}" for u in plane.upstreams]
    await eventually(lambda: sum(plane.restarts(t) for t in tasks) == 1)
    # One of the two dies (the health guard keeps at most half of a pool failed by probes).
    dead = plane.upstreams[0]
    await dead.stop()

    async def dead_failed() -> bool:
        record = await plane.record(dead.address)
        return record is not None and record.state == "failed"

    await eventually(dead_failed)


async def test_scrape_recovers(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first scrape that reads an answer raises; its task is restarted and scrapes again.
    calls = fail_once(monkeypatch, LoadTracker, "update", RuntimeError("scrape bug"))
    tasks = [f"scrape:coder/{u.address}" for u in plane.upstreams]
    await eventually(lambda: sum(plane.restarts(t) for t in tasks) == 1, within=15)
    await eventually(lambda: calls() >= 2, within=15)


async def test_publishing_health_on_taking_leadership_recovers(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_once(monkeypatch, plane.service.checker, "publish_all", RuntimeError("publish bug"))
    await plane.client.revoke_lease(plane.service.leader._lease)  # leadership lost, then retaken
    await eventually(lambda: plane.restarts("publish-health") == 1)
    await eventually(lambda: "publish-health" not in plane.service.supervisor.running())
    assert plane.service.leader.leading


async def test_kvgate_status_shows_a_failing_task(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(url: str, limit: float) -> bool:
        raise ValueError("probe cannot parse its own answer")

    monkeypatch.setattr(plane.service.checker, "_probe", broken)
    await eventually(lambda: len(plane.service.supervisor.failing()) >= 2)
    result = await run_cli("status", "--json", admin=str(plane.config.control_plane.admin))
    assert result.code == 0, result.err
    status = json.loads(result.out)
    failing = {t["task"]: t for t in status["failing_tasks"]}
    for upstream in plane.upstreams:
        task = failing[f"probe:coder/{upstream.address}"]
        assert task["restarts"] >= 1
        assert task["error"] == "ValueError: probe cannot parse its own answer"
    assert status["membership_generation"] == 1 and status["membership_warning"] is None

