"""etcd out of space (the NOSPACE alarm), on a real etcd with a small quota: every background
task keeps running, the error is named (logs, metrics, `kvgate status`), and once an operator
compacts, defragments and disarms the alarm, writes resume: the queued binding is written, the
engine that died meanwhile is marked failed, used bindings move to new leases again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.model import Binding
from kvgate.endpoints.records import EndpointRecord, record_key
from kvgate.etcd import EtcdClient, EtcdNoSpace
from kvgate.etcd.observed import EtcdErrorLog
from kvgate.runtime.tasks.supervisor import Supervisor
from tests.admin.admin_helpers import run_cli
from tests.conftest import ETCD_SMALL_QUOTA
from tests.failsafe.failsafe_helpers import (
    control_plane_config,
    running_control_plane,
    write_config,
)
from tests.support.polling import eventually


async def _fill(client: EtcdClient, prefix: str) -> EtcdNoSpace:
    """Writes 100 KB values until etcd refuses; returns its (classified) refusal."""
    for i in range(1000):  # 100 MB, far beyond the small quota
        try:
            await client.put(f"{prefix}junk/{i}".encode(), b"x" * 100_000)
        except EtcdNoSpace as exc:
            return exc
    raise AssertionError("etcd never ran out of space")


async def test_nospace_is_named_survived_and_recovered_from(
    small_etcd, prefix: str, tmp_path: Path, upstreams
) -> None:
    a, b = await upstreams(2)
    config = control_plane_config([a.address, b.address], small_etcd.endpoint, prefix)
    path = write_config(tmp_path / "kvgate.yaml", config)
    operator = EtcdClient([small_etcd.endpoint])
    registry = CollectorRegistry()
    ext_proc_errors = EtcdErrorLog("ext_proc", registry)
    store_client = EtcdClient([small_etcd.endpoint], on_error=ext_proc_errors)
    supervisor = Supervisor("ext_proc", registry)
    store = EtcdBindingStore(store_client, prefix, idle_ttl=12, supervisor=supervisor)
    toucher: asyncio.Task[None] | None = None
    async with running_control_plane(config, path) as plane:
        try:
            await store.start()
            await eventually(lambda: plane.leader.leading)
            used = await store.create(Binding("used", "coder", b.address))

            async def keep_using() -> None:
                while True:
                    store.touch(used)
                    await asyncio.sleep(0.1)

            toucher = asyncio.create_task(keep_using())
            with capture_logs() as logs:
                refusal = await _fill(operator, prefix)
                assert refusal.kind == "no_space" and "database space exceeded" in str(refusal)
                assert await operator.alarms() == ["NOSPACE"]

                # While etcd refuses writes: an engine dies, a new session arrives.
                await a.stop()
                queued = await store.create(Binding("new", "coder", b.address))
                assert queued.revision == 0 and store.degraded and store.pending == 1
                await eventually(lambda: any(e["event"] == "endpoint_publish_failed"
                                             and e["kind"] == "no_space" for e in logs))
                await eventually(lambda: "no_space" in {e.kind for e in ext_proc_errors.recent()})
                await eventually(lambda: _alarm(plane.registry) == 1)
                await eventually(lambda: any(e["event"] == "bindings_lease_refresh_failed"
                                             and e["kind"] == "no_space" for e in logs),
                                 within=15)
            assert any(e["event"] == "etcd_degraded" and e["kind"] == "no_space" for e in logs)
            assert any(e["event"] == "etcd_alarm" and e["alarm"] == "NOSPACE" for e in logs)
            # Every background task is still running: nothing died, nothing restarted.
            assert supervisor.failing() == [] and plane.supervisor.failing() == []
            assert set(supervisor.running()) == {"bindings-mirror", "bindings-refresh",
                                                 "bindings-reattach", "bindings-flush"}
            assert registry.get_sample_value(
                "kvgate_etcd_errors_total", {"service": "ext_proc", "kind": "no_space"}) >= 1
            status = await _status(str(config.control_plane.admin))
            assert status["etcd_alarms"] == ["NOSPACE"]
            assert "no_space" in {e["kind"] for e in status["etcd_errors"]}
            assert status["failing_tasks"] == []
            text = await run_cli("status", admin=str(config.control_plane.admin))
            assert "etcd alarm     NOSPACE" in text.out
            assert status["etcd_db_bytes"] >= ETCD_SMALL_QUOTA * 0.9  # full, and shown

            # The operator's fix (docs/operating.md, etcd out of space): free space, compact,
            # defragment, disarm.
            lease_before = await _lease_of(operator, prefix, used)
            await operator.delete_prefix(f"{prefix}junk/".encode())
            await operator.compact()
            await operator.defragment()
            assert await operator.disarm_alarms() == 1
            assert await operator.alarms() == []

            async def dead_engine_failed() -> bool:
                kv = await operator.get(record_key(prefix, "coder", a.address))
                return kv is not None and EndpointRecord.decode(
                    "coder", a.address, kv.value).state == "failed"

            await eventually(dead_engine_failed, within=15)
            await eventually(lambda: store.pending == 0 and not store.degraded)
            assert await operator.get(f"{prefix}bindings/{queued.key}".encode()) is not None

            async def moved_to_a_new_lease() -> bool:
                lease = await _lease_of(operator, prefix, used)
                return lease is not None and lease != lease_before

            await eventually(moved_to_a_new_lease, within=15)  # lease refresh is alive
            await eventually(lambda: _alarm(plane.registry) == 0)  # seen as cleared
        finally:
            if toucher is not None:
                toucher.cancel()
            await store.close()
            await store_client.close()
            await operator.close()


def _alarm(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("kvgate_etcd_alarm",
                                     {"service": "control_plane", "alarm": "NOSPACE"})


async def _lease_of(client: EtcdClient, prefix: str, binding: Binding) -> int | None:
    kv = await client.get(f"{prefix}bindings/{binding.key}".encode())
    return None if kv is None else kv.lease


async def _status(admin: str) -> dict:
    result = await run_cli("status", "--json", admin=admin)
    assert result.code == 0, result.err
    return json.loads(result.out)
