"""Every background task of ext_proc survives an unexpected exception: logged, counted in
kvgate_task_restarts_total{service="ext_proc",task}, restarted, and doing its job again.
A real etcd; the binding store and the ext_proc service in process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from ext_proc.service import ExtProcOptions, ExtProcService
from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.model import Binding
from kvgate.bindings.reattach import Reattachment
from kvgate.config.model import HostPort
from kvgate.endpoints import EndpointRecords, sync_membership
from kvgate.etcd import EtcdClient, EtcdUnavailable
from kvgate.runtime.tasks.supervisor import Supervisor
from tests.failsafe.failsafe_helpers import control_plane_config, fail_once, restarts
from tests.support.polling import eventually

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


@dataclass
class Replica:
    store: EtcdBindingStore
    client: EtcdClient
    registry: CollectorRegistry

    @property
    def reattachment(self) -> Reattachment:
        return self.store.reattachment

    def restarts(self, task: str) -> float:
        return restarts(self.registry, "ext_proc", task)

    async def lease_in_etcd(self, binding: Binding, prefix: str) -> int | None:
        kv = await self.client.get(f"{prefix}bindings/{binding.key}".encode())
        return None if kv is None else kv.lease


@pytest.fixture
async def replicas(etcd, prefix: str) -> AsyncIterator[Callable[..., Awaitable[Replica]]]:
    made: list[Replica] = []

    async def make(idle_ttl: float = 3600, write_limit_s: float = 2.0) -> Replica:
        registry = CollectorRegistry()
        client = EtcdClient([etcd.endpoint])
        store = EtcdBindingStore(client, prefix, idle_ttl, write_limit_s=write_limit_s,
                                 supervisor=Supervisor("ext_proc", registry))
        await store.start()
        made.append(Replica(store, client, registry))
        return made[-1]

    yield make
    for replica in made:
        await replica.store.close()
        await replica.client.close()


async def test_bindings_mirror_recovers(replicas, monkeypatch: pytest.MonkeyPatch) -> None:
    watcher, writer = await replicas(), await replicas()
    fail_once(monkeypatch, watcher.store, "apply", RuntimeError("bad event"))
    with capture_logs() as logs:
        await writer.store.create(Binding("s-1", "coder", A))
        await eventually(lambda: watcher.restarts("bindings-mirror") == 1)
    assert any(e["event"] == "task_failed" and e["task"] == "bindings-mirror"
               and e["error"] == "RuntimeError: bad event" for e in logs)
    await eventually(lambda: watcher.store.get("coder", "s-1") is not None)


@pytest.mark.parametrize(("task", "target", "method"), [
    ("bindings-refresh", "client", "grant_lease"),
    ("bindings-reattach", "reattachment", "reattach_epoch"),
])
async def test_a_used_binding_still_moves_to_the_newest_lease(
    task: str, target: str, method: str, replicas, prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replica = await replicas(idle_ttl=4)  # an epoch (new lease) per second
    binding = await replica.store.create(Binding("s-2", "coder", A))
    first = await replica.lease_in_etcd(binding, prefix)
    fail_once(monkeypatch, getattr(replica, target), method, RecursionError("too deep"))

    async def reattached() -> bool:
        replica.store.touch(binding)  # in use all along
        lease = await replica.lease_in_etcd(binding, prefix)
        return lease is not None and lease != first

    await eventually(lambda: replica.restarts(task) == 1)
    await eventually(reattached)


async def test_degraded_mode_flush_recovers(replicas, prefix: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    replica = await replicas()
    # etcd misses the hot-path write and its retry, so the binding is queued for the flush
    # task, whose first attempt then hits a bug.
    fail_once(monkeypatch, replica.client, "create", EtcdUnavailable("away", operation="Txn"),
              calls_failed=2)
    fail_once(monkeypatch, replica.store.flush, "flush", RuntimeError("flush bug"))
    local = await replica.store.create(Binding("s-3", "coder", B))
    assert local.revision == 0 and replica.store.degraded
    await eventually(lambda: replica.restarts("bindings-flush") == 1)
    await eventually(lambda: replica.store.pending == 0 and not replica.store.degraded)
    assert await replica.lease_in_etcd(local, prefix) is not None


async def test_ext_proc_endpoints_mirror_recovers(etcd, prefix: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    config = control_plane_config([A, B], etcd.endpoint, prefix)
    client = EtcdClient([etcd.endpoint])
    await sync_membership(client, config, "test", claim=False)
    service = ExtProcService(config, ExtProcOptions(
        listen=HostPort("127.0.0.1", 0), metrics=None, etcd_endpoints=(etcd.endpoint,)))
    await service.start()
    try:
        fail_once(monkeypatch, service.directory, "apply", RuntimeError("bad record"))
        await EndpointRecords(client, prefix).update(
            "coder", A, lambda r: replace(r, admin="draining"))
        await eventually(lambda: restarts(service.metrics.registry, "ext_proc",
                                          "endpoints-mirror") == 1)
        await eventually(lambda: service.directory.states()["coder"][A] == "draining")
    finally:
        await service.stop(grace=0)
        await client.close()


async def test_a_replica_that_cannot_reach_etcd_steps_aside_and_comes_back(
        etcd, prefix: str) -> None:
    """Envoy's health check asks for decisions (DECISIONS_HEALTH_SERVICE): not serving while the
    binding store is degraded, so Envoy sends decisions to the replicas that reach etcd; the
    overall health, which liveness probes read, stays serving throughout."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from kvgate.contract.envoy import DECISIONS_HEALTH_SERVICE

    config = control_plane_config([A, B], etcd.endpoint, prefix)
    service = ExtProcService(config, ExtProcOptions(
        listen=HostPort("127.0.0.1", 0), metrics=None, etcd_endpoints=(etcd.endpoint,)))
    await service.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.port}")
    health = health_pb2_grpc.HealthStub(channel)

    async def status(name: str) -> int:
        reply = await health.Check(  # type: ignore[attr-defined]  # the stub's stubs omit it
            health_pb2.HealthCheckRequest(service=name), timeout=2)
        return int(reply.status)

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, \
        health_pb2.HealthCheckResponse.NOT_SERVING
    try:
        assert await status(DECISIONS_HEALTH_SERVICE) == serving
        await etcd.stop()
        await service.store.create(Binding("s-away", "coder", A))  # finds etcd away: degraded
        await eventually(lambda: status(DECISIONS_HEALTH_SERVICE),
                         until=lambda s: s == not_serving, what="stepped aside")
        assert await status("") == serving
        await etcd.start()
        await eventually(lambda: status(DECISIONS_HEALTH_SERVICE),
                         until=lambda s: s == serving, what="serving again", within=30)
    finally:
        await channel.close()
        await service.stop(grace=0)
