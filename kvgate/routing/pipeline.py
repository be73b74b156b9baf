"""The routing decision, apart from any transport: session → filter → score → pick → commit.

Choose first, commit after: placement is computed from the local view, then committed through
the binding store, whose answer (possibly a concurrent replica's earlier binding) is final. The
policy (`kvgate.routing.policy`) chooses; its booking hooks run once the request is routed.

While the store's writes do not reach etcd (degraded), the other replicas cannot see what this
one binds, and Envoy sends a session's turns to any replica: a new or re-placed session then goes
where Envoy's ring puts it, which every replica computes alike, and no session is moved for load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from kvgate.bindings.model import Binding, MoveEstimate, binding_key
from kvgate.bindings.store import BindingStore, Unbound
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.placement import fallback_for, place, session_hash
from kvgate.placement.view import PoolView
from kvgate.routing.decision import (
    PROMPT_WANTED,
    SESSIONLESS,
    Decision,
    NoActiveEndpoint,
    Outcome,
    UnknownPool,
)
from kvgate.routing.policy import STATIC, Known, Moved, Placing, Policy
from kvgate.session import SessionIds

# A binding to an endpoint in these states stays; a failed or removed one's is re-placed.
_KEEPS_SESSIONS = (EndpointState.ACTIVE, EndpointState.DRAINING)
# The load gate's moves: optional (one etcd does not take now is not made, it would split).
_GATE_MOVES = (MoveReason.LOAD, MoveReason.EVICTED)


class Directory(Protocol):
    """Each pool's current view (kvgate.endpoints.EndpointDirectory, or a simulator's)."""

    def view(self, pool: str) -> PoolView: ...


class Pipeline:
    """One decision per request: `decide(pool, session, prompt_tokens)`."""

    def __init__(
        self, store: BindingStore, directory: Directory, load_factor: float,
        *, policy: Policy = STATIC, max_bindings: int = 0,
        on_unbound: Callable[[str, str, Unbound], None] = lambda pool, session, why: None,
        sessions: SessionIds | None = None,
    ) -> None:
        self._store = store
        self._directory = directory
        self._load_factor = load_factor
        self._max_bindings = max_bindings  # per pool; 0: no cap
        self._on_unbound = on_unbound
        self._inflight: dict[str, asyncio.Future[Binding]] = {}  # placements being written
        self._sessions = sessions if sessions is not None else SessionIds()
        self.policy = policy

    async def decide(self, pool: str, raw_session: bytes | None,
                     prompt_tokens: int = 0, *, ring: bytes | None = None,
                     blocks: Sequence[int] = (), prompt: bool = False) -> Decision:
        """`prompt_tokens`: an estimate of the request's prompt size (0: unknown), which a
        load-aware policy prices the request with. `ring`: what Envoy's ring hashes for this
        session when not `raw_session` itself (a key carried percent-encoded). `blocks`: the
        prompt's chained block hashes where the caller knows them (the simulator), which the
        gate's prefix step places new sessions with. `prompt`: the caller can still read the
        prompt (ext_proc, which then asks Envoy for the body): where the policy would weigh
        its blocks, the answer is `PROMPT_WANTED`, and the caller asks again with `blocks`. A
        bound session's sticky turn never asks."""
        session = self._sessions.normalize(raw_session) if raw_session is not None else None
        if session is None:
            return self._sessionless(pool, prompt_tokens)
        view = self._directory.view(pool)
        if not view.members:
            raise UnknownPool(f"no endpoints known for pool {pool!r}")
        hash_value = session_hash(ring if ring is not None else raw_session or b"")
        binding = self._store.get(pool, session)
        if binding is None and not self._store.synced:
            # Still loading (or the watch is lost): another replica may have bound it.
            binding = await self._store.fetch(pool, session)
        policy = self.policy
        known = policy.known(pool, session, prompt_tokens)
        if blocks:
            known = known._replace(blocks=blocks)
        state = None if binding is None else view.state(binding.endpoint)
        moved: Moved | None = None
        if binding is not None and state in _KEEPS_SESSIONS:
            assert state is not None
            if not self._store.degraded:  # a move the other replicas cannot see splits it
                placing = Placing(view, hash_value, self._store.load(pool), self._load_factor)
                moved = policy.reconsider(placing, binding.endpoint, state, known)
            if moved is None:
                self._store.touch(binding)
                for hook in policy.hooks:
                    hook.kept(pool, session, binding.endpoint, known)
                return self._decision(Outcome.STICKY, view, hash_value, binding.endpoint,
                                      session)
        if prompt and self._wants_prompt(moved):
            return PROMPT_WANTED
        return await self._place(pool, session, view, hash_value, binding, state, known,
                                 moved)

    def _wants_prompt(self, moved: Moved | None) -> bool:
        """The policy would weigh the prompt's blocks: it places by them (a new session, or
        one whose engine left), or it moves the session for load (a move prices what each
        sibling holds of the prompt). Not a re-home (the session's own context decides it),
        nor a placement on Envoy's ring (while writes do not reach etcd)."""
        if not self.policy.reads_prompts:
            return False
        if moved is not None:
            return moved.reason is MoveReason.LOAD
        return not self._store.places_on_ring

    async def _place(self, pool: str, session: str, view: PoolView, hash_value: int,
                     binding: Binding | None, state: EndpointState | None, known: Known,
                     moved: Moved | None) -> Decision:
        """A new session, one whose endpoint failed or left, or one the policy moves."""
        reason: MoveReason | None = None
        target = None if moved is None else moved.endpoint
        estimate = None if moved is None else moved.estimate
        if moved is not None:
            reason = moved.reason
        elif binding is not None:
            reason = MoveReason.FAILED if state is EndpointState.FAILED else MoveReason.DRAINED
        outcome = Outcome.NEW if binding is None else Outcome.REBIND
        previous = None if binding is None else binding.endpoint
        try:
            if binding is None and 0 < self._max_bindings <= self._store.count(pool):
                # Existing bindings are never evicted for newcomers (session.max_bindings).
                raise Unbound("max_bindings", f"pool {pool!r} holds "
                              f"{self._store.count(pool)} bindings (session.max_bindings: "
                              f"{self._max_bindings})")
            binding = await self._commit(pool, session, hash_value, binding, known, target,
                                         reason, estimate)
        except Unbound as why:
            self._on_unbound(pool, session, why)
            return Decision(Outcome.UNBOUND, (), session)
        if previous is not None and binding.endpoint == previous:
            outcome, reason = Outcome.STICKY, None  # a concurrent decision kept it there
        for hook in self.policy.hooks:
            hook.routed(pool, session, view, binding.endpoint, previous, known,
                        moved=reason is not None)
        return self._decision(outcome, view, hash_value, binding.endpoint, session, reason)

    def _sessionless(self, pool: str, prompt_tokens: int) -> Decision:
        """No session: Envoy's balancing picks, unless the policy routes the request itself
        (the load gate, for a request of known size: it books it, so its load counts)."""
        if prompt_tokens <= 0 or not self.policy.hooks:
            return SESSIONLESS
        view = self._directory.view(pool)
        endpoint = self.policy.sessionless(view, prompt_tokens) if view.members else None
        if endpoint is None:
            return SESSIONLESS
        # A retry goes to another engine of its KV pool, as a session's would.
        fallback = fallback_for(view, session_hash(endpoint.encode()), endpoint)
        return Decision(Outcome.SESSIONLESS, (endpoint,) if fallback is None
                        else (endpoint, fallback))

    @staticmethod
    def _decision(outcome: Outcome, view: PoolView, hash_value: int, endpoint: str,
                  session: str, reason: MoveReason | None = None) -> Decision:
        fallback = fallback_for(view, hash_value, endpoint)
        endpoints = (endpoint,) if fallback is None else (endpoint, fallback)
        return Decision(outcome, endpoints, session, reason)

    async def _commit(
        self, pool: str, session: str, hash_value: int, current: Binding | None,
        known: Known, target: str | None = None, reason: MoveReason | None = None,
        estimate: MoveEstimate | None = None,
    ) -> Binding:
        """One placement per session at a time: the same session's first requests arrive
        together, and all of them wait for the one write. The write runs as its own task so a
        request Envoy gives up on does not abandon it halfway. `target`: where the policy
        moves it (else the policy places it now), with what it `estimate`d."""
        key = binding_key(pool, session)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(
                self._place_and_store(pool, session, hash_value, current, known, target,
                                      reason, estimate))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(task)

    def _settle(self, key: str, task: asyncio.Future[Binding]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a failure nobody awaited any more is not logged as lost

    async def _place_and_store(
        self, pool: str, session: str, hash_value: int, current: Binding | None,
        known: Known, target: str | None, reason: MoveReason | None,
        estimate: MoveEstimate | None,
    ) -> Binding:
        # The view and counts as of this write's turn (an earlier write may have landed).
        view = self._directory.view(pool)
        on_ring = False
        if target is None:
            prefer = None if current is None else view.kv_pool_of(current.endpoint)
            exclude = None if current is None else current.endpoint
            on_ring = self._store.places_on_ring
            if on_ring:
                target = _ring(view, hash_value, prefer, exclude)
            else:
                placing = Placing(view, hash_value, self._store.load(pool), self._load_factor)
                target = self.policy.place(placing, known, prefer_kv_pool=prefer,
                                           exclude=exclude)
        if target is None:
            raise NoActiveEndpoint(f"pool {pool!r} has no active endpoint")
        if current is None:
            stored = await self._store.create(Binding(session, pool, target, hash=hash_value))
            ring = None if on_ring or stored.revision else _ring(view, hash_value)
            if ring is not None and ring != stored.endpoint:
                # The write did not reach etcd (it waits in the queue): the other replicas
                # will place this session's next turns without it, on the ring.
                return await self._store.move(stored, ring)
            return stored
        # Memory keeps no ring hash per binding; the stored value carries it for the failover.
        # The gate's moves are optional (_GATE_MOVES): one etcd does not take now is not made.
        return await self._store.move(replace(current, hash=hash_value), target, reason,
                                      optional=reason in _GATE_MOVES, estimate=estimate)


def _ring(view: PoolView, hash_value: int, prefer_kv_pool: str | None = None,
          exclude: str | None = None) -> str | None:
    """Where Envoy's ring puts a session (its KV pool's ring first), whatever the load: while
    writes do not reach etcd, the one placement every replica computes alike."""
    return place(view, hash_value, {}, 1.0, prefer_kv_pool=prefer_kv_pool, exclude=exclude)
