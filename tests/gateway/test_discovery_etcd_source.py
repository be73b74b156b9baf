"""The registrations source as the control plane runs it, against the real etcd (no Envoy): a
registration becomes an active endpoint record within a second; etcd cut off from the control
plane changes nothing and shows as the source's growing age and error; a register that stops
drains its engine, and the drain's end removes its record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from control_plane.discovery import Discovery, SourceView
from control_plane.discovery.metrics import DiscoveryMetrics
from kvgate.config import load_text
from kvgate.contract.states import EndpointState, Role
from kvgate.discovery.registrations import Registration, registration_key
from kvgate.endpoints import EndpointDirectory, EndpointRecord
from kvgate.etcd import EtcdClient, PrefixMirror
from kvgate.runtime.tasks.supervisor import Supervisor
from kvgate_cli.register import keep_registered
from tests.conftest import EtcdServer
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import eventually

ENGINE = "127.0.0.2:8000"


@pytest.fixture
async def proxy(etcd: EtcdServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(etcd.endpoint) as cut_able:
        yield cut_able


def _view(discovery: Discovery) -> SourceView:
    return discovery.views()[0]


async def test_registrations_come_survive_a_partition_and_go(
        etcd: EtcdServer, proxy: FaultProxy, prefix: str) -> None:
    config = load_text(f"etcd: {{prefix: '{prefix}'}}\n"
                       "pools: [{name: coder, kv_pool: kv-a, "
                       "discover: {etcd: {weight: 3}, drain: 1s}, "
                       # a pool of one: its engine may leave (the bound is 0 by default)
                       "health: {max_failed_fraction: 1.0}}]")
    registry = CollectorRegistry()
    supervisor = Supervisor("test", registry)
    plane = EtcdClient([proxy.address], timeout=1.0)  # the control plane's, through the proxy
    engine_side = EtcdClient([etcd.endpoint])  # the register's, never cut
    directory = EndpointDirectory(config)
    supervisor.spawn("endpoints", PrefixMirror(plane, directory.prefix, directory).run)
    discovery = Discovery(plane, directory, supervisor, DiscoveryMetrics(registry),
                          leading=lambda: True, fence=lambda: None)
    discovery.configure(config)
    await discovery.start()
    stop = asyncio.Event()
    said: list[str] = []
    registration = Registration("coder", ENGINE, kv_pool="kv-b", role=Role.DECODE)
    register = asyncio.create_task(keep_registered(engine_side, prefix, registration, 5, stop,
                                                   said.append))
    try:
        await eventually(lambda: said, what="registered")
        start = time.monotonic()
        record: EndpointRecord = await eventually(
            lambda: directory.record("coder", ENGINE), what="the engine's record")
        print(f"registration → active record in {time.monotonic() - start:.2f} s")
        assert time.monotonic() - start <= 1.0
        assert (record.state, record.source, record.kv_pool, record.weight) == (
            EndpointState.ACTIVE, "etcd", "kv-b", 3)

        proxy.cut(reset=True)
        view = await eventually(lambda: _view(discovery), until=lambda v: bool(v.error),
                                what="the source failing")
        await asyncio.sleep(2.5)  # the partition's length: longer than the drain, not a wait
        view = _view(discovery)
        assert view.error and view.age_s is not None and view.age_s >= 2.0
        assert discovery.reconcilers["coder"].engines[ENGINE].leaving_since is None
        proxy.heal()
        await eventually(lambda: _view(discovery), until=lambda v: not v.error,
                         what="the source answering again")
        record = await eventually(lambda: directory.record("coder", ENGINE), what="record")
        assert record.state is EndpointState.ACTIVE and record.left_at is None

        stop.set()
        await register
        await eventually(lambda: directory.record("coder", ENGINE),
                         until=lambda r: r is not None and r.state is EndpointState.DRAINING,
                         what="drained when its register stopped")
        await eventually(lambda: directory.record("coder", ENGINE) is None, what="removed")
    finally:
        stop.set()
        await register
        await supervisor.stop()
        await plane.close()
        await engine_side.close()


async def test_register_writes_again_after_losing_its_lease(etcd: EtcdServer, prefix: str) -> None:
    client = EtcdClient([etcd.endpoint])
    stop = asyncio.Event()
    said: list[str] = []
    registration = Registration("coder", ENGINE, weight=2)
    key = registration_key(prefix, "coder", ENGINE)
    register = asyncio.create_task(keep_registered(client, prefix, registration, 3, stop,
                                                   said.append))
    try:
        first = await eventually(lambda: client.get(key), what="registered")
        await client.revoke_lease(first.lease)  # as if etcd had expired it
        again = await eventually(lambda: client.get(key), until=lambda kv: kv is not None
                                 and kv.lease != first.lease, what="registered again")
        assert Registration.decode("coder", ENGINE, again.value) == registration
        assert any("registering" in line for line in said), said
        stop.set()
        await register
        assert await client.get(key) is None  # revoked on the way out: the engine left
    finally:
        stop.set()
        await register
        await client.close()
