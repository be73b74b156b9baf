"""The routing decision, apart from gRPC: session → binding → endpoint(s).

Choose first, commit after: placement is computed from the local view, then committed through
the binding store, whose answer (possibly a concurrent replica's earlier binding) is final.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from kvgate.bindings.model import Binding, binding_key
from kvgate.bindings.store import BindingStore, Unbound
from kvgate.contract.states import EndpointState
from kvgate.endpoints import EndpointDirectory
from kvgate.placement import fallback_for, place, session_hash
from kvgate.session import SessionIds

# A binding to an endpoint in these states stays; a failed or removed one's is re-placed.
_KEEPS_SESSIONS = (EndpointState.ACTIVE, EndpointState.DRAINING)


class Outcome(StrEnum):
    STICKY = "sticky"
    NEW = "new"
    REBIND = "rebind"
    SESSIONLESS = "sessionless"
    UNBOUND = "unbound"  # no binding made (queue full, binding cap): Envoy's ring places it
    ERROR = "error"


class DecisionError(Exception):
    """A request kvgate cannot place; the gateway degrades to Envoy's own ring for it."""


class UnknownPool(DecisionError):
    pass


class NoActiveEndpoint(DecisionError):
    pass


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    endpoints: tuple[str, ...] = ()  # primary first, then the retry fallback
    session: str | None = None


SESSIONLESS = Decision(Outcome.SESSIONLESS)


class Decider:
    def __init__(
        self, store: BindingStore, directory: EndpointDirectory, load_factor: float,
        *, max_bindings: int = 0,
        on_unbound: Callable[[str, str, Unbound], None] = lambda pool, session, why: None,
    ) -> None:
        self._store = store
        self._directory = directory
        self._load_factor = load_factor
        self._max_bindings = max_bindings  # per pool; 0: no cap
        self._on_unbound = on_unbound
        self._inflight: dict[str, asyncio.Future[Binding]] = {}  # placements being written
        self._sessions = SessionIds()

    async def decide(self, pool: str, raw_session: bytes | None) -> Decision:
        session = self._sessions.normalize(raw_session) if raw_session is not None else None
        if session is None:
            return SESSIONLESS
        view = self._directory.view(pool)
        if not view.members:
            raise UnknownPool(f"no endpoints known for pool {pool!r}")
        hash_value = session_hash(raw_session or b"")
        binding = self._store.get(pool, session)
        if binding is None and not self._store.synced:
            # Still loading (or the watch is lost): another replica may have bound it.
            binding = await self._store.fetch(pool, session)
        state = None if binding is None else view.state(binding.endpoint)
        if binding is not None and state in _KEEPS_SESSIONS:
            self._store.touch(binding)
            outcome = Outcome.STICKY
        else:
            outcome = Outcome.NEW if binding is None else Outcome.REBIND
            try:
                if binding is None and 0 < self._max_bindings <= self._store.count(pool):
                    # Existing bindings are never evicted for newcomers (session.max_bindings).
                    raise Unbound("max_bindings", f"pool {pool!r} holds "
                                  f"{self._store.count(pool)} bindings (session.max_bindings: "
                                  f"{self._max_bindings})")
                binding = await self._commit(pool, session, hash_value, binding)
            except Unbound as why:
                self._on_unbound(pool, session, why)
                return Decision(Outcome.UNBOUND, (), session)
        fallback = fallback_for(view, hash_value, binding.endpoint)
        endpoints = (binding.endpoint,) if fallback is None else (binding.endpoint, fallback)
        return Decision(outcome, endpoints, session)

    async def _commit(
        self, pool: str, session: str, hash_value: int, current: Binding | None
    ) -> Binding:
        """One placement per session at a time: the same session's first requests arrive
        together, and all of them wait for the one write. The write runs as its own task so a
        request Envoy gives up on does not abandon it halfway."""
        key = binding_key(pool, session)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(
                self._place_and_store(pool, session, hash_value, current)
            )
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(task)

    def _settle(self, key: str, task: asyncio.Future[Binding]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a failure nobody awaited any more is not logged as lost

    async def _place_and_store(
        self, pool: str, session: str, hash_value: int, current: Binding | None
    ) -> Binding:
        view = self._directory.view(pool)
        loads = self._store.load(pool)
        previous_kv = None if current is None else view.kv_pool_of(current.endpoint)
        target = place(
            view, hash_value, loads, self._load_factor,
            prefer_kv_pool=previous_kv,
            exclude=None if current is None else current.endpoint,
        )
        if target is None:
            raise NoActiveEndpoint(f"pool {pool!r} has no active endpoint")
        if current is None:
            return await self._store.create(Binding(session, pool, target, hash=hash_value))
        # Memory keeps no ring hash per binding; the stored value carries it for the failover.
        return await self._store.move(replace(current, hash=hash_value), target)
