"""Endpoint records in etcd, changed by compare-and-set so operators and health checks
never overwrite each other's word."""

from __future__ import annotations

from collections.abc import Callable

from kvgate.endpoints.records import EndpointRecord, endpoints_prefix, record_key
from kvgate.etcd import EtcdClient
from kvgate.etcd.records import Fence


class UnknownEndpoint(LookupError):
    pass


class EndpointRecords:
    def __init__(self, client: EtcdClient, prefix: str) -> None:
        self._client = client
        self._prefix = prefix

    async def list(self, pool: str | None = None) -> list[EndpointRecord]:
        base = endpoints_prefix(self._prefix)
        kvs, _ = await self._client.get_prefix(base + (f"{pool}/".encode() if pool else b""))
        records = []
        for kv in kvs:
            pool_name, _, address = kv.key[len(base):].decode().partition("/")
            try:
                records.append(EndpointRecord.decode(pool_name, address, kv.value))
            except (ValueError, KeyError, TypeError):
                continue
        return records

    async def find(self, address: str, pool: str | None = None) -> EndpointRecord:
        """The record of `address` (in `pool`, or in the one pool that has it)."""
        matches = [r for r in await self.list(pool) if r.address == address]
        if not matches:
            where = f" in pool {pool!r}" if pool else ""
            raise UnknownEndpoint(f"no endpoint {address}{where}")
        if len(matches) > 1:
            pools = ", ".join(r.pool for r in matches)
            raise UnknownEndpoint(f"{address} is in several pools ({pools}); name one with --pool")
        return matches[0]

    async def update(
        self, pool: str, address: str, change: Callable[[EndpointRecord], EndpointRecord],
        fence: Fence | None = None,
    ) -> EndpointRecord:
        """Applies `change` to the current record, retrying if someone else wrote meanwhile;
        with a leader's `fence`, only while it still leads (else EtcdFenced)."""
        key = record_key(self._prefix, pool, address)
        for _ in range(20):
            kv = await self._client.get(key)
            if kv is None:
                raise UnknownEndpoint(f"no endpoint {address} in pool {pool!r}")
            current = EndpointRecord.decode(pool, address, kv.value)
            updated = change(current)
            if updated == current:
                return current
            done, _ = await self._client.replace(key, updated.encode(), kv.mod_revision,
                                                 fence=fence)
            if done:
                return updated
        raise RuntimeError(f"endpoint {address}: too many concurrent updates")
