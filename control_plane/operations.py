"""What operators can do and see, over etcd: the admin API's whole logic, without gRPC.

Endpoint changes are compare-and-set updates of endpoint records; session moves are
compare-and-set updates of bindings that keep the binding's lease (its idle expiry).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvgate.bindings.model import Binding
from kvgate.contract.states import EndpointState
from kvgate.endpoints import EndpointRecord, EndpointRecords, UnknownEndpoint
from kvgate.etcd import EtcdClient
from kvgate.session import normalize_session


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


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    record: EndpointRecord
    sessions: int
    load: EndpointLoad = field(default_factory=EndpointLoad)


@dataclass(frozen=True, slots=True)
class SessionBinding:
    binding: Binding
    lease: int


class Operations:
    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        loads: Callable[[str], EndpointLoad] = lambda address: EndpointLoad(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._records = EndpointRecords(client, prefix)
        self._loads = loads
        self._clock = clock

    async def etcd_alarms(self) -> list[str]:
        """etcd's active alarms (NOSPACE: writes refused until an operator disarms it)."""
        return await self._client.alarms()

    # -- endpoints -------------------------------------------------------------------------

    async def list_endpoints(self, pool: str | None = None) -> list[EndpointStatus]:
        records = await self._records.list(pool)
        counts = Counter((b.binding.pool, b.binding.endpoint) for b in await self._bindings(pool))
        return [
            EndpointStatus(r, counts[(r.pool, r.address)], self._loads(r.address))
            for r in sorted(records, key=lambda r: (r.pool, r.address))
        ]

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
        self, pool: str | None = None, endpoint: str | None = None, limit: int = 100
    ) -> list[SessionBinding]:
        found = [
            b for b in await self._bindings(pool)
            if endpoint is None or b.binding.endpoint == endpoint
        ]
        found.sort(key=lambda b: (b.binding.pool, b.binding.session))
        return found[:limit] if limit > 0 else found

    async def show_session(self, session: str) -> list[SessionBinding]:
        """The session's bindings in every pool; `session` as the client sends it, or its UUID."""
        normalized = normalize_session(session.encode())
        if normalized is None:
            raise Invalid("an empty session id has no binding")
        found = [b for b in await self._bindings(None) if b.binding.session == normalized]
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
        moved = replace(current.binding, endpoint=endpoint)
        done, now = await self._client.replace(
            self._binding_key(moved), moved.encode(), current.binding.revision, current.lease
        )
        if not done:
            raise Invalid("the session was re-bound meanwhile; look again and retry")
        revision = now.mod_revision if now is not None else 0
        return SessionBinding(replace(moved, revision=revision), current.lease)

    async def _bindings(self, pool: str | None) -> list[SessionBinding]:
        base = f"{self._prefix}bindings/".encode()
        kvs, _ = await self._client.get_prefix(base + (f"{pool}/".encode() if pool else b""))
        found = []
        for kv in kvs:
            key = kv.key[len(base):].decode(errors="replace")
            try:
                found.append(SessionBinding(Binding.decode(key, kv.value, kv.mod_revision),
                                            kv.lease))
            except (ValueError, KeyError, TypeError, json.JSONDecodeError):
                continue
        return found

    def _binding_key(self, binding: Binding) -> bytes:
        return f"{self._prefix}bindings/{binding.key}".encode()
