"""The leader's writes: etcd's endpoint records made to say what a pool's reconciler holds.

Level-triggered: every round compares the reconciler's engines with the records the endpoints
mirror shows and writes only the difference, each write a compare-and-set; so a write lost to a
leader change or a race is simply made again by the next round. The operator's and the health
checks' word in a record is kept: a drain only starts on an engine that is active."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import structlog

from kvgate.contract.states import EndpointState
from kvgate.discovery.reconcile import Engine, Reconciler
from kvgate.endpoints import EndpointRecord, EndpointRecords, UnknownEndpoint
from kvgate.endpoints.records import record_key
from kvgate.etcd import EtcdClient
from kvgate.etcd.records import Fence, Guard, Write

log = structlog.get_logger("kvgate.discovery")


def wanted(engine: Engine, deadline: float | None, pool: str) -> EndpointRecord:
    leaving = engine.leaving_since is not None
    return EndpointRecord(
        pool, engine.found.address, engine.found.kv_pool, engine.found.weight,
        admin=EndpointState.DRAINING if leaving else EndpointState.ACTIVE,
        drain_deadline=deadline, role=engine.found.role, source=engine.source,
        left_at=engine.leaving_since)


def follow(record: EndpointRecord, engine: Engine, deadline: float | None) -> EndpointRecord:
    """`record` changed as little as possible to say what the reconciler says of `engine`."""
    found = engine.found
    record = replace(record, kv_pool=found.kv_pool, weight=found.weight, role=found.role)
    if engine.leaving_since is not None and record.left_at is None:
        if record.admin == EndpointState.ACTIVE:
            record = replace(record, admin=EndpointState.DRAINING, drain_deadline=deadline)
        return replace(record, left_at=engine.leaving_since)
    if engine.leaving_since is None and record.left_at is not None:
        admin = EndpointState.ACTIVE if record.admin == EndpointState.DRAINING else record.admin
        return replace(record, admin=admin, drain_deadline=None, left_at=None)
    return record


def _follow(engine: Engine, deadline: float | None, record: EndpointRecord) -> EndpointRecord:
    return follow(record, engine, deadline)


class RecordWriter:
    def __init__(self, client: EtcdClient, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._records = EndpointRecords(client, prefix)

    async def apply(self, pool: str, reconciler: Reconciler, records: list[EndpointRecord],
                    fence: Fence | None) -> int:
        """Writes what differs; returns the number of writes etcd took."""
        by_address = {r.address: r for r in records}
        writes = 0
        for address, engine in sorted(reconciler.engines.items()):
            deadline = reconciler.deadline(engine)
            record = by_address.get(address)
            if record is None:
                key = record_key(self._prefix, pool, address)
                done, _ = await self._client.replace(
                    key, wanted(engine, deadline, pool).encode(), 0, fence=fence)
                writes += done
            elif record.discovered and follow(record, engine, deadline) != record:
                try:
                    await self._records.update(pool, address,
                                               partial(_follow, engine, deadline), fence=fence)
                    writes += 1
                except UnknownEndpoint:
                    pass  # deleted meanwhile: the next round creates it
        for record in records:
            if record.discovered and record.address not in reconciler.engines:
                writes += await self._delete(record)
        return writes

    async def _delete(self, record: EndpointRecord) -> int:
        key = record_key(self._prefix, record.pool, record.address)
        kv = await self._client.get(key)
        if kv is None:
            return 0
        current = EndpointRecord.decode(record.pool, record.address, kv.value)
        if not current.discovered:
            return 0  # the file lists it now
        done = await self._client.commit([Guard(key, kv.mod_revision)], [Write(key, None)])
        if done is not None:
            log.info("discovered_engine_removed", pool=record.pool, endpoint=record.address,
                     source=record.source)
        return int(done is not None)
