"""Which endpoints each pool has, written to etcd so that a stale file cannot overwrite a newer one.

Keys: `{prefix}membership` → {"generation", "digest", "by", "at"} and the endpoint records
`{prefix}endpoints/{pool}/{ip:port}` (kvgate.endpoints.records).

Who writes (docs/operating.md, "Who writes membership"):
- the first control plane ever to start against the prefix (no membership key): generation 1;
- a control plane whose file was reloaded (SIGHUP or a change of the file): generation + 1; a
  reload is the operator saying "this file is now the newest";
- a control plane whose file has the stored digest, only to finish a write interrupted half way.
A control plane merely *started* with a file whose membership differs writes nothing (`claim`
False): it serves etcd's membership and says so until it is reloaded.

Every write is a transaction (≤ `CHUNK` records each) guarded by the membership key's revision
and every record's revision: a concurrent drain or health update makes it fail, and it is re-read
and merged (the operator's and the health checks' word is kept); a newer generation written by
another replica meanwhile is never overwritten (MembershipConflict).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvgate.config.model import Config
from kvgate.endpoints.records import EndpointRecord, endpoints_prefix, record_key
from kvgate.etcd import EtcdClient, KeyValue
from kvgate.etcd.client import Guard, WatchEvent, Write

CHUNK = 100  # records per transaction: etcd refuses more than --max-txn-ops (128 by default)


class MembershipConflict(Exception):
    """Another replica wrote a different membership meanwhile; nothing of ours was written."""


@dataclass(frozen=True, slots=True)
class StoredMembership:
    generation: int
    digest: str
    by: str = ""  # the writing replica's identity
    at: float = 0.0  # unix time of the write

    def encode(self) -> bytes:
        return json.dumps({"generation": self.generation, "digest": self.digest,
                           "by": self.by, "at": self.at}).encode()

    @classmethod
    def decode(cls, value: bytes) -> StoredMembership:
        data = json.loads(value)
        return cls(int(data["generation"]), str(data["digest"]), str(data.get("by", "")),
                   float(data.get("at", 0.0)))


@dataclass(frozen=True, slots=True)
class MembershipState:
    """What etcd holds after a sync, and whether it is this replica's file's membership."""

    stored: StoredMembership | None
    in_sync: bool  # etcd's membership is this file's
    changed: int = 0  # records written or deleted


def membership_key(prefix: str) -> bytes:
    return f"{prefix}membership".encode()


def membership_digest(config: Config) -> str:
    """A digest of what the records hold from the file: pools, addresses, KV pools, weights."""
    members = sorted((p.name, e.key, e.kv_pool, e.weight) for p in config.pools
                     for e in p.endpoints)
    return hashlib.sha256(json.dumps(members).encode()).hexdigest()[:16]


async def read_membership(client: EtcdClient, prefix: str) -> StoredMembership | None:
    kv = await client.get(membership_key(prefix))
    return None if kv is None else _decode(kv)


async def sync_membership(
    client: EtcdClient,
    config: Config,
    identity: str,
    *,
    claim: bool,
    clock: Callable[[], float] = time.time,
    attempts: int = 20,
    before_write: Callable[[], None] | None = None,
) -> MembershipState:
    """Makes etcd's endpoint records match `config` if this replica may (see the module's doc);
    `claim` is True for a reload. Raises MembershipConflict, or EtcdError from etcd.

    `before_write` runs right before each write is sent (never when nothing is to be written):
    from then on etcd's watchers, this replica's own mirror included, may see the new records."""
    prefix = config.etcd.prefix
    digest = membership_digest(config)
    base: int | None = None  # the generation this write replaces
    for _ in range(attempts):
        kv = await client.get(membership_key(prefix))
        stored = None if kv is None else _decode(kv)
        if stored is not None and stored.digest != digest:
            if not claim:
                return MembershipState(stored, in_sync=False)
            if base is not None and stored.generation != base:
                raise MembershipConflict(
                    f"replica {stored.by or '?'} wrote membership generation {stored.generation} "
                    "meanwhile; reload again to make this file the newest"
                )
        if base is None:
            base = 0 if stored is None else stored.generation
        records, _ = await client.get_prefix(endpoints_prefix(prefix))
        writes, guards = _record_changes(config, records)
        head_revision = 0 if kv is None else kv.mod_revision
        head: Write | None = None
        written = stored
        if stored is None or stored.digest != digest:
            written = StoredMembership((0 if stored is None else stored.generation) + 1, digest,
                                       identity, clock())
            head = Write(membership_key(prefix), written.encode())
        if head is None and not writes:
            return MembershipState(written, in_sync=True)
        if before_write is not None:
            before_write()
        if await _apply(client, membership_key(prefix), head_revision, head, writes, guards):
            return MembershipState(written, in_sync=True, changed=len(writes))
        # A guard failed: a record or the membership changed meanwhile. Read again and merge.
    raise MembershipConflict(f"endpoint records kept changing during {attempts} attempts")


async def _apply(
    client: EtcdClient, key: bytes, head_revision: int, head: Write | None,
    writes: list[Write], guards: list[Guard],
) -> bool:
    """The writes in chunks, each guarded by the membership key's revision (the first chunk also
    writes the membership key, so the later ones are guarded by the revision it got)."""
    first = True
    for start in range(0, max(len(writes), 1), CHUNK):
        chunk_writes = writes[start:start + CHUNK]
        chunk_guards = [Guard(key, head_revision), *guards[start:start + CHUNK]]
        if first and head is not None:
            chunk_writes = [head, *chunk_writes]
        revision = await client.commit(chunk_guards, chunk_writes)
        if revision is None:
            return False
        if first and head is not None:
            head_revision = revision
        first = False
    return True


def _record_changes(config: Config, kvs: list[KeyValue]) -> tuple[list[Write], list[Guard]]:
    """The record writes that make etcd match `config`, each with its guard: new endpoints start
    active, existing ones keep the operator's and health checks' word, others are removed."""
    prefix = config.etcd.prefix
    base = endpoints_prefix(prefix)
    current: dict[bytes, tuple[EndpointRecord | None, int]] = {}
    for kv in kvs:
        pool_name, _, address = kv.key[len(base):].decode(errors="replace").partition("/")
        try:
            current[kv.key] = (EndpointRecord.decode(pool_name, address, kv.value),
                               kv.mod_revision)
        except (ValueError, KeyError, TypeError):
            current[kv.key] = (None, kv.mod_revision)  # unreadable: rewritten from the file
    writes: list[Write] = []
    guards: list[Guard] = []
    wanted: set[bytes] = set()
    discovering = {pool.name for pool in config.pools if pool.discover is not None}
    for pool in config.pools:
        for endpoint in pool.endpoints:
            key = record_key(prefix, pool.name, endpoint.key)
            wanted.add(key)
            old, revision = current.get(key, (None, 0))
            record = EndpointRecord(pool.name, endpoint.key, endpoint.kv_pool, endpoint.weight,
                                    role=endpoint.role)
            if old is not None:
                record = replace(record, admin=old.admin, healthy=old.healthy,
                                 drain_deadline=old.drain_deadline)
            if old != record:
                writes.append(Write(key, record.encode()))
                guards.append(Guard(key, revision))
    for key in sorted(current.keys() - wanted):
        found = current[key][0]
        if found is not None and found.discovered and found.pool in discovering:
            continue  # discovery's, not the file's (control_plane.discovery)
        writes.append(Write(key, None))
        guards.append(Guard(key, current[key][1]))
    return writes, guards


def _decode(kv: KeyValue) -> StoredMembership | None:
    try:
        return StoredMembership.decode(kv.value)
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: treated as absent, so a start rewrites it


class MembershipWatch:
    """A PrefixMirror handler for the membership key: what etcd holds now (None: nothing)."""

    def __init__(self, prefix: str) -> None:
        self.key = membership_key(prefix)
        self.stored: StoredMembership | None = None

    def reset(self, kvs: list[KeyValue]) -> None:
        self.stored = next((_decode(kv) for kv in kvs if kv.key == self.key), None)

    def apply(self, event: WatchEvent) -> None:
        if event.kv.key == self.key:
            self.stored = None if event.deleted else _decode(event.kv)
