"""What each ext_proc replica reports about itself, in etcd, for `kvgate status`.

Every few seconds a replica writes `{prefix}replicas/ext_proc/{identity}` on a short lease: its
mirrors' sync state, its bindings, its queue, and the sessions per endpoint it holds. A replica
that stops (or loses etcd) stops reporting, and its key expires within REPORT_TTL, so status
never shows a dead replica as healthy. At a million bindings the per-endpoint counts of a synced
replica are also how the control plane answers `kvgate status` and `endpoints list` in time,
without reading every binding.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import structlog

from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.errors import EtcdLeaseNotFound
from kvgate.etcd.mirror import MirrorState, MirrorStatus

log = structlog.get_logger("kvgate.replicas")

REPORT_EVERY = 5.0  # seconds
REPORT_TTL = 15  # seconds: three reports missed and the replica is gone from status


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    identity: str
    at: float  # unix time
    bindings: int = 0
    pending: int = 0
    degraded: bool = False
    unbound: int = 0
    mirrors: tuple[MirrorStatus, ...] = ()
    loads: dict[str, dict[str, int]] = field(default_factory=dict)  # pool → endpoint → sessions
    # endpoint → the load gate's backlog estimate (seconds of prefill queued); empty: gate off
    backlog: dict[str, float] = field(default_factory=dict)
    load_source: str = ""  # placement.load_gate.source (scrape, collector); empty: gate off
    load_age_s: float | None = None  # collector: age of its newest figure (None: none yet)
    collector_reachable: bool = False  # collector: figures no older than max_load_age_s arrive

    @property
    def synced(self) -> bool:
        """Its bindings mirror holds etcd's current content (its counts are etcd's)."""
        return any(m.name == "bindings" and m.state == MirrorState.SYNCED for m in self.mirrors)

    def encode(self) -> bytes:
        data = asdict(self)
        data["mirrors"] = [{**asdict(m), "state": str(m.state)} for m in self.mirrors]
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> ReplicaReport:
        data = json.loads(value)
        mirrors = tuple(
            MirrorStatus(str(m["name"]), MirrorState(m["state"]), float(m["since"]),
                         int(m["revision"]), int(m["relists"]), m.get("error"))
            for m in data.get("mirrors", ())
        )
        loads = {str(pool): {str(e): int(n) for e, n in counts.items()}
                 for pool, counts in data.get("loads", {}).items()}
        backlog = {str(e): float(s) for e, s in data.get("backlog", {}).items()}
        age = data.get("load_age_s")
        return cls(str(data["identity"]), float(data["at"]), int(data.get("bindings", 0)),
                   int(data.get("pending", 0)), bool(data.get("degraded", False)),
                   int(data.get("unbound", 0)), mirrors, loads, backlog,
                   str(data.get("load_source", "")), None if age is None else float(age),
                   bool(data.get("collector_reachable", False)))


def reports_prefix(prefix: str) -> bytes:
    return f"{prefix}replicas/ext_proc/".encode()


async def read_reports(client: EtcdClient, prefix: str) -> list[ReplicaReport]:
    """Every ext_proc replica's latest report, by identity (unreadable ones skipped)."""
    kvs, _ = await client.get_prefix(reports_prefix(prefix))
    reports = []
    for kv in kvs:
        try:
            reports.append(ReplicaReport.decode(kv.value))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("replica_report_unreadable", key=kv.key.decode(errors="replace"))
    return sorted(reports, key=lambda r: r.identity)


class ReportPublisher:
    """Writes this replica's report every REPORT_EVERY seconds on a REPORT_TTL lease."""

    def __init__(
        self, client: EtcdClient, prefix: str, identity: str,
        collect: Callable[[], ReplicaReport], every: float = REPORT_EVERY,
        ttl: int = REPORT_TTL,
    ) -> None:
        self._client = client
        self._key = reports_prefix(prefix) + identity.encode()
        self._collect = collect
        self._every = every
        self._ttl = ttl
        self._lease = 0
        self._failed: EtcdError | None = None

    async def run(self) -> None:
        while True:
            try:
                await self.publish()
            except EtcdError as exc:
                if self._failed is None or self._failed.kind != exc.kind:
                    log.warning("replica_report_failed", kind=str(exc.kind), error=str(exc))
                self._failed = exc
            else:
                self._failed = None
            await asyncio.sleep(self._every)

    async def publish(self) -> None:
        if self._lease and await self._client.keep_alive_once(self._lease) <= 0:
            self._lease = 0
        if not self._lease:
            self._lease = await self._client.grant_lease(self._ttl)
        try:
            await self._client.put(self._key, self._collect().encode(), self._lease)
        except EtcdLeaseNotFound:
            self._lease = 0
            raise

    async def withdraw(self) -> None:
        """On a clean stop: the report goes at once rather than when its lease expires."""
        try:
            await self._client.delete(self._key)
            if self._lease:
                await self._client.revoke_lease(self._lease)
        except EtcdError:
            pass  # it expires by itself
