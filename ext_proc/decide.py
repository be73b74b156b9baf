"""The routing decision, apart from gRPC: session → binding → endpoint(s).

Choose first, commit after: placement is computed from the local view, then committed through
the binding store, whose answer (possibly a concurrent replica's earlier binding) is final.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from ext_proc.recent import PrefillMix, RecentSessions, Seen
from kvgate.bindings.model import Binding, binding_key
from kvgate.bindings.store import BindingStore, Unbound
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.endpoints import EndpointDirectory
from kvgate.placement import fallback_for, place, session_hash
from kvgate.placement.gate import LoadGate, PromptSize
from kvgate.placement.view import PoolView
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
    reason: MoveReason | None = None  # why a REBIND moved the session


SESSIONLESS = Decision(Outcome.SESSIONLESS)
_UNKNOWN_SIZE = PromptSize()


class Decider:
    def __init__(
        self, store: BindingStore, directory: EndpointDirectory, load_factor: float,
        *, max_bindings: int = 0,
        on_unbound: Callable[[str, str, Unbound], None] = lambda pool, session, why: None,
        gate: LoadGate | None = None, clock: Callable[[], float] = time.monotonic,
        recent: RecentSessions | None = None, mix: PrefillMix | None = None,
    ) -> None:
        self._store = store
        self._directory = directory
        self._load_factor = load_factor
        self._max_bindings = max_bindings  # per pool; 0: no cap
        self._on_unbound = on_unbound
        self._inflight: dict[str, asyncio.Future[Binding]] = {}  # placements being written
        self._sessions = SessionIds()
        # The load gate (None: static stickiness), on the clock its load board is kept on.
        self.gate = gate
        self._clock = clock
        self.recent = recent if recent is not None else RecentSessions()
        self.mix = mix if mix is not None else PrefillMix()  # what booked requests cost

    async def decide(self, pool: str, raw_session: bytes | None,
                     prompt_tokens: int = 0) -> Decision:
        """`prompt_tokens`: an estimate of the request's prompt size (0: unknown), which the
        load gate prices the request with."""
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
        gate = self.gate
        state = None if binding is None else view.state(binding.endpoint)
        reason: MoveReason | None = None
        target: str | None = None
        seen = None
        if binding is not None and state in _KEEPS_SESSIONS:
            if gate is None:  # static stickiness: no clock, no size, nothing booked
                self._store.touch(binding)
                return self._decision(Outcome.STICKY, view, hash_value, binding.endpoint,
                                      session)
            now = self._clock()
            seen = self.recent.get(pool, session)
            endpoint = binding.endpoint
            # Moving saves at most this engine's backlog: under the gate's threshold nothing
            # else is looked at (the sticky hot path stays O(1), nothing allocated for it).
            if (state is EndpointState.ACTIVE
                    and gate.board.backlog_s(endpoint, now) >= gate.config.min_saving_s):
                move = gate.reconsider(
                    view, endpoint, hash_value, self._store.load(pool), self._load_factor, now,
                    PromptSize(prompt_tokens, 0 if seen is None else seen.tokens),
                    None if seen is None else seen.moved_at)
                if move is not None:
                    target, reason = move.endpoint, MoveReason.LOAD
            if target is None:
                self._store.touch(binding)
                self._book_sticky(gate, pool, session, endpoint, now, prompt_tokens, seen)
                return self._decision(Outcome.STICKY, view, hash_value, endpoint, session)
        if gate is None:
            now, size = 0.0, _UNKNOWN_SIZE
        else:
            now = self._clock()
            seen = seen or self.recent.get(pool, session)
            size = PromptSize(prompt_tokens, 0 if seen is None else seen.tokens)
        if binding is not None and reason is None:
            reason = MoveReason.FAILED if state is EndpointState.FAILED else MoveReason.DRAINED
        outcome = Outcome.NEW if binding is None else Outcome.REBIND
        try:
            if binding is None and 0 < self._max_bindings <= self._store.count(pool):
                # Existing bindings are never evicted for newcomers (session.max_bindings).
                raise Unbound("max_bindings", f"pool {pool!r} holds "
                              f"{self._store.count(pool)} bindings (session.max_bindings: "
                              f"{self._max_bindings})")
            previous = None if binding is None else binding.endpoint
            binding = await self._commit(pool, session, hash_value, binding, size, target,
                                         reason)
        except Unbound as why:
            self._on_unbound(pool, session, why)
            return Decision(Outcome.UNBOUND, (), session)
        if previous is not None and binding.endpoint == previous:
            outcome, reason = Outcome.STICKY, None  # a concurrent decision kept it there
        self._routed(view, pool, session, binding.endpoint, now, size, previous,
                     moved=reason is not None)
        return self._decision(outcome, view, hash_value, binding.endpoint, session, reason)

    @staticmethod
    def _decision(outcome: Outcome, view: PoolView, hash_value: int, endpoint: str,
                  session: str, reason: MoveReason | None = None) -> Decision:
        fallback = fallback_for(view, hash_value, endpoint)
        endpoints = (endpoint,) if fallback is None else (endpoint, fallback)
        return Decision(outcome, endpoints, session, reason)

    def _book_sticky(self, gate: LoadGate, pool: str, session: str, endpoint: str, now: float,
                     prompt_tokens: int, seen: Seen | None) -> None:
        """_routed() for a session that stays: its context is in its engine's HBM."""
        context = 0 if seen is None else seen.tokens
        if prompt_tokens > 0:  # unknown size (no body, chunked): nothing booked, see _routed
            prefill = gate.cost.prefill_s(prompt_tokens - context)
            gate.board.routed(endpoint, now, prefill)
            self.mix.add(prefill)
        tokens = max(prompt_tokens, context)
        if seen is None or seen.tokens != tokens:
            self.recent.remember(pool, session, tokens, None)

    def _routed(self, view: PoolView, pool: str, session: str, endpoint: str, now: float,
                size: PromptSize, previous: str | None, *, moved: bool = False) -> None:
        """Book the request on the load board (the work it adds to its engine) and remember
        the session's size for its next turn."""
        gate = self.gate
        if gate is None:
            return
        cost = gate.cost
        context = size.context_tokens
        if size.prompt_tokens <= 0:
            # A request of unknown size (no body: /v1/models; a chunked body) books nothing:
            # guessing would build a backlog from requests that may prefill nothing. Its
            # engine's own report still counts.
            self.recent.remember(pool, session, context, now if moved else None)
            return
        if previous == endpoint:  # its context is in this engine's HBM
            prefill = cost.prefill_s(size.prompt_tokens - context)
            gate.board.routed(endpoint, now, prefill)
        elif previous is not None and view.kv_pool_of(previous) == view.kv_pool_of(endpoint):
            # Moved within its DDR pool: the context is read from DDR first.
            prefill = cost.prefill_s(size.prompt_tokens - context)
            gate.board.routed(endpoint, now, prefill, ready_at=now + cost.transfer_s(context))
        else:
            prefill = cost.prefill_s(size.prompt_tokens)
            gate.board.routed(endpoint, now, prefill)
        self.mix.add(prefill)
        self.recent.remember(pool, session, max(size.prompt_tokens, context),
                             now if moved else None)

    async def _commit(
        self, pool: str, session: str, hash_value: int, current: Binding | None,
        size: PromptSize, target: str | None = None, reason: MoveReason | None = None,
    ) -> Binding:
        """One placement per session at a time: the same session's first requests arrive
        together, and all of them wait for the one write. The write runs as its own task so a
        request Envoy gives up on does not abandon it halfway. `target`: where the load gate
        moves it (else placement chooses)."""
        key = binding_key(pool, session)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(
                self._place_and_store(pool, session, hash_value, current, size, target, reason)
            )
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(task)

    def _settle(self, key: str, task: asyncio.Future[Binding]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a failure nobody awaited any more is not logged as lost

    async def _place_and_store(
        self, pool: str, session: str, hash_value: int, current: Binding | None,
        size: PromptSize, target: str | None, reason: MoveReason | None,
    ) -> Binding:
        if target is None:
            view = self._directory.view(pool)
            loads = self._store.load(pool)
            previous_kv = None if current is None else view.kv_pool_of(current.endpoint)
            exclude = None if current is None else current.endpoint
            if self.gate is not None:
                target = self.gate.place(view, hash_value, loads, self._load_factor,
                                         self._clock(), size, prefer_kv_pool=previous_kv,
                                         exclude=exclude)
            else:
                target = place(view, hash_value, loads, self._load_factor,
                               prefer_kv_pool=previous_kv, exclude=exclude)
        if target is None:
            raise NoActiveEndpoint(f"pool {pool!r} has no active endpoint")
        if current is None:
            return await self._store.create(Binding(session, pool, target, hash=hash_value))
        # Memory keeps no ring hash per binding; the stored value carries it for the failover.
        return await self._store.move(replace(current, hash=hash_value), target, reason)
