"""What operators can do and see, over etcd: the admin API's whole logic, without gRPC.

Endpoint changes are compare-and-set updates of endpoint records; session moves are
compare-and-set updates of bindings that keep the binding's lease (its idle expiry).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from control_plane.counts import session_counts
from kvgate.bindings.model import Binding
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.endpoints import EndpointRecord, EndpointRecords, UnknownEndpoint
from kvgate.etcd import EtcdClient, KeyValue
from kvgate.etcd.scan import fixed_windows, window
from kvgate.pd.turns import TurnRecord, turn_key
from kvgate.replicas import REPORT_TTL, ReplicaReport, read_reports
from kvgate.session import normalize_session

LIST_LIMIT = 10_000  # the most sessions one `sessions list` call returns (pages beyond it)


class OperationError(Exception):
    """A request an operator made that cannot be carried out; the message says why."""


class NotFound(OperationError):
    pass


class Invalid(OperationError):
    pass


@dataclass(frozen=True, slots=True)
class EndpointLoad:
    """What the last scrape of an engine's /metrics said (None: not scraped yet)."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    hit_rate: float | None = None  # prefix-cache hits / queries since the control plane started
    backlog_s: float | None = None  # the load gate's estimate: the largest an ext_proc reports


@dataclass(frozen=True, slots=True)
class Probes:
    """What this control-plane replica's probes say of an engine now."""

    failing: bool = False  # they call it dead (past health.unhealthy_threshold)
    held: str = ""  # why it stays active though they do (the health guard); "" if not held


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    record: EndpointRecord
    sessions: int
    load: EndpointLoad = field(default_factory=EndpointLoad)
    probes: Probes = field(default_factory=Probes)


@dataclass(frozen=True, slots=True)
class SessionBinding:
    binding: Binding
    lease: int
    last_turn: TurnRecord | None = None  # prefill/decode pools: its latest turn (kvgate.pd)


@dataclass(frozen=True, slots=True)
class EndpointList:
    endpoints: list[EndpointStatus]
    sessions_note: str | None = None  # set when the counts are not an exact count in etcd


@dataclass(frozen=True, slots=True)
class SessionPage:
    sessions: list[SessionBinding]
    next_after: str | None = None  # `pool/session` to pass as `after` for the next page


class Operations:
    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        loads: Callable[[str], EndpointLoad] = lambda address: EndpointLoad(),
        clock: Callable[[], float] = time.time,
        probes: Callable[[str, str], Probes] = lambda pool, address: Probes(),
        on_moved: Callable[[MoveReason, int], None] = lambda reason, count: None,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._records = EndpointRecords(client, prefix)
        self._loads = loads
        self._probes = probes  # (pool, address) → this replica's probes of it
        self._clock = clock
        self._on_moved = on_moved  # counts the sessions an operator moved

    async def etcd_alarms(self) -> list[str]:
        """etcd's active alarms (NOSPACE: writes refused until an operator disarms it)."""
        return await self._client.alarms()

    async def etcd_db(self) -> tuple[int, int]:
        """etcd's database size and the part of it in use (bytes)."""
        return await self._client.db_size()

    async def ext_proc_reports(self) -> list[ReplicaReport]:
        return await read_reports(self._client, self._prefix)

    # -- endpoints -------------------------------------------------------------------------

    async def list_endpoints(self, pool: str | None = None) -> EndpointList:
        """Every endpoint with its sessions (counts, never a listing: kvgate.control_plane
        counts), last scraped load and what the probes say now."""
        records = await self._records.list(pool)
        counts = await session_counts(self._client, self._prefix, pool, self._clock)
        backlogs = await self._backlogs()
        return EndpointList([
            EndpointStatus(r, counts.by_endpoint[(r.pool, r.address)],
                           replace(self._loads(r.address), backlog_s=backlogs.get(r.address)),
                           self._probes(r.pool, r.address))
            for r in sorted(records, key=lambda r: (r.pool, r.address))
        ], counts.note)

    async def _backlogs(self) -> dict[str, float]:
        """Per engine, the largest backlog a live ext_proc replica reports (each knows the work
        it sent; the largest is the closest to the engine's real queue)."""
        found: dict[str, float] = {}
        fresh = self._clock() - REPORT_TTL
        for report in await read_reports(self._client, self._prefix):
            if report.at < fresh:
                continue
            for address, seconds in report.backlog.items():
                found[address] = max(seconds, found.get(address, 0.0))
        return found

    async def drain(
        self, address: str, pool: str | None = None, deadline_s: float | None = None
    ) -> EndpointRecord:
        """No new sessions; existing ones stay until idle or until `deadline_s` from now."""
        if deadline_s is not None and deadline_s < 0:
            raise Invalid("deadline must be >= 0 seconds")
        deadline = None if deadline_s is None else self._clock() + deadline_s
        return await self._change(
            address, pool,
            lambda r: replace(r, admin=EndpointState.DRAINING, drain_deadline=deadline),
        )

    async def undrain(self, address: str, pool: str | None = None) -> EndpointRecord:
        """Back to active: undoes a drain or a manual fail."""
        return await self._change(
            address, pool, lambda r: replace(r, admin=EndpointState.ACTIVE, drain_deadline=None)
        )

    async def fail(self, address: str, pool: str | None = None) -> EndpointRecord:
        """Failed by hand: its sessions move now, and health checks cannot bring it back."""
        return await self._change(
            address, pool, lambda r: replace(r, admin=EndpointState.FAILED, drain_deadline=None)
        )

    async def _change(
        self, address: str, pool: str | None, change: Callable[[EndpointRecord], EndpointRecord]
    ) -> EndpointRecord:
        try:
            record = await self._records.find(address, pool)
            return await self._records.update(record.pool, record.address, change)
        except UnknownEndpoint as exc:
            raise NotFound(str(exc)) from None

    # -- sessions --------------------------------------------------------------------------

    async def list_sessions(
        self, pool: str | None = None, endpoint: str | None = None, limit: int = 100,
        after: str | None = None,
    ) -> SessionPage:
        """One page of bindings in key order (pool, then session) of the pools etcd has endpoint
        records for: at most `limit` (LIST_LIMIT at most), starting after `after`
        (`pool/session`, or a session of `pool`)."""
        limit = 100 if limit <= 0 else min(limit, LIST_LIMIT)
        start = None if after is None else self._after_key(after, pool) + b"\0"
        pools = [pool] if pool else sorted({r.pool for r in await self._records.list()})
        found: list[SessionBinding] = []
        for name in pools:
            base = self._bindings_prefix() + f"{name}/".encode()
            # Windows of a few thousand keys each: etcd counts every key up to a Range's end.
            for low, high in fixed_windows(base):
                if start is not None and high <= start:
                    continue
                low = max(low, start) if start is not None else low
                async for page, _ in window(self._client, low, high, min(limit + 1, 1000)):
                    for kv in page:
                        binding = self._decode(kv)
                        if binding is None or (endpoint is not None
                                               and binding.binding.endpoint != endpoint):
                            continue
                        if len(found) == limit:  # one more exists: the next page starts here
                            return SessionPage(found, found[-1].binding.key)
                        found.append(binding)
        return SessionPage(found)

    def _after_key(self, after: str, pool: str | None) -> bytes:
        pool_name, slash, session = after.partition("/")
        if not slash:
            if pool is None:
                raise Invalid("--after needs --pool, or the pool/session a previous page named")
            pool_name, session = pool, after
        normalized = normalize_session(session.encode())
        if normalized is None:
            raise Invalid("--after names no session")
        return self._bindings_prefix() + f"{pool_name}/{normalized}".encode()

    async def show_session(self, session: str) -> list[SessionBinding]:
        """The session's bindings in every pool; `session` as the client sends it, or its UUID.
        One read per pool, whatever the number of bindings."""
        normalized = normalize_session(session.encode())
        if normalized is None:
            raise Invalid("an empty session id has no binding")
        found = []
        for pool in sorted({r.pool for r in await self._records.list()}):
            kv = await self._client.get(self._bindings_prefix() + f"{pool}/{normalized}".encode())
            binding = None if kv is None else self._decode(kv)
            if binding is not None:
                found.append(await self._with_turn(binding, pool, normalized))
        if not found:
            raise NotFound(f"no binding for session {session!r} ({normalized})")
        return found

    async def move_session(
        self, session: str, endpoint: str, pool: str | None = None
    ) -> SessionBinding:
        """Re-binds a session to an active endpoint of its pool (compare-and-set)."""
        bindings = await self.show_session(session)
        if pool is not None:
            bindings = [b for b in bindings if b.binding.pool == pool]
            if not bindings:
                raise NotFound(f"session {session!r} has no binding in pool {pool!r}")
        if len(bindings) != 1:
            pools = ", ".join(b.binding.pool for b in bindings)
            raise Invalid(f"session is bound in pools: {pools}; name one with --pool")
        current = bindings[0]
        try:
            target = await self._records.find(endpoint, current.binding.pool)
        except UnknownEndpoint as exc:
            raise NotFound(str(exc)) from None
        if target.state != EndpointState.ACTIVE:
            raise Invalid(f"{endpoint} is {target.state}; sessions only move to active endpoints")
        moved = current.binding.moved_to(endpoint, MoveReason.MANUAL, self._clock())
        done, now = await self._client.replace(
            self._binding_key(moved), moved.encode(), current.binding.revision, current.lease
        )
        if not done:
            raise Invalid("the session was re-bound meanwhile; look again and retry")
        self._on_moved(MoveReason.MANUAL, 1)
        revision = now.mod_revision if now is not None else 0
        return SessionBinding(replace(moved, revision=revision), current.lease)

    def _bindings_prefix(self) -> bytes:
        return f"{self._prefix}bindings/".encode()

    async def _with_turn(self, found: SessionBinding, pool: str,
                         session: str) -> SessionBinding:
        kv = await self._client.get(turn_key(self._prefix, pool, session))
        if kv is None:
            return found
        try:
            return replace(found, last_turn=TurnRecord.from_bytes(kv.value))
        except (ValueError, KeyError, TypeError):
            return found  # unreadable: shown as no record

    def _decode(self, kv: KeyValue) -> SessionBinding | None:
        key = kv.key[len(self._bindings_prefix()):].decode(errors="replace")
        try:
            return SessionBinding(Binding.decode(key, kv.value, kv.mod_revision), kv.lease)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            return None

    def _binding_key(self, binding: Binding) -> bytes:
        return f"{self._prefix}bindings/{binding.key}".encode()
