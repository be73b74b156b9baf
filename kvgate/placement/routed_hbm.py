"""What each engine's HBM still holds, estimated from what this gateway routed there: the gate's
`HbmResidency` where the engines publish no KV events (`placement.load_gate.hbm_estimate`).

Per engine, the sessions routed there in order of their last turn, each with its context (the
gate's units: its last prompt as estimated), against the engine's HBM KV capacity
(`placement.engine_cost.hbm_tokens`). What falls past capacity in last-use order is estimated
evicted, the least recently used first and a session's last tokens before its first. That is
vLLM's order: a finished request's blocks join the tail of the free queue, in reverse so that
a chain's tail leaves before its head, and a new block is taken from the head, evicting what it
held (vllm/v1/core/kv_cache_utils.py `FreeKVCacheBlockQueue`: "the least recent used block is
at the front", `popleft`, `append_n`; block_pool.py `BlockPool.free_blocks` appends,
`BlockPool.get_new_blocks` pops from the front and `_maybe_evict_cached_block`;
single_type_kv_cache_manager.py `free` reverses a request's blocks).

The prefix every session placed on an engine shares (a harness, a system prompt) is held once
there, not once per session: it is learned from the prompts' leading blocks where a placement
knows them (the common leading blocks of every session placed on the engine), taken off the
engine's capacity, and off each session later placed there. Without blocks it is 0 (each
session counted whole: the estimate evicts early).

O(1) amortised per turn: a turn moves its session to the tail of its engine's order and
evicts from the head; each session leaves at most once per time it was recorded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvgate.generations import Generations
from kvgate.placement.evictions import EvictionRate

# Sessions remembered (where each was last routed): as many as the gate's memory of sessions
# (kvgate.routing.recent.RecentSessions).
SESSIONS = 262_144


class _Engine:
    """One engine's sessions in last-use order (least recent first) and what they hold."""

    __slots__ = ("address", "alive", "common", "evicted", "limit", "order", "rate", "shared",
                 "total")

    def __init__(self, address: str, capacity: int) -> None:
        self.address = address
        self.alive = True  # False once forgotten (left the fleet)
        self.order: OrderedDict[str, _Held] = OrderedDict()
        self.total = 0  # tokens held by the sessions in `order` (their own parts)
        self.common: list[int] | None = None  # leading blocks every placement here shared
        self.shared = 0  # tokens of `common`, once two placements agree on it
        self.limit = capacity  # what the sessions' own parts may hold: capacity less `shared`
        self.evicted = 0  # tokens estimated evicted so far
        self.rate = EvictionRate()


class _Held:
    """One session on one engine: its context, the part of it shared with every other session
    there (held once, on the engine's account), and how much of the rest is still held."""

    __slots__ = ("engine", "held", "own", "resident", "shared", "tokens")

    def __init__(self, engine: _Engine, tokens: int, shared: int) -> None:
        self.engine = engine
        self.tokens = tokens
        self.shared = min(shared, tokens)
        self.own = tokens - self.shared
        self.held = self.own
        self.resident = True  # in its engine's order (not wholly evicted)


class RoutedHbm:
    """The estimate over every engine this gateway routed to."""

    def __init__(self, capacity_tokens: int, block_tokens: int | None = None,
                 sessions: int = SESSIONS) -> None:
        """`capacity_tokens`: one engine's HBM for KV (tokens); `block_tokens`: the size of a
        placement's blocks (`Known.blocks`), for the shared prefix and the eviction rate."""
        if capacity_tokens <= 0:
            raise ValueError(f"HBM capacity must be positive, got {capacity_tokens}")
        self.capacity = capacity_tokens
        self.block_tokens = block_tokens
        self._engines: dict[str, _Engine] = {}
        self._where: Generations[str, _Held | None] = Generations(sessions)
        self._now = 0.0  # the last turn's instant: the eviction rate's clock

    def _find(self, session: str) -> _Held | None:
        """Where `session` was last routed, kept in the current generation while in use."""
        held = self._where.current.get(session)
        if held is None:
            held = self._where.find(session, None)
            if held is not None:
                self._where.put(session, held)
        return held

    def turn(self, endpoint: str, session: str, tokens: int, now: float) -> None:
        """A turn of `session` sent to `endpoint`, where it was routed before: its context
        (`tokens`) is held whole there again, the most recently used."""
        self._now = now
        held = self._where.current.get(session)  # the sticky path: one lookup
        if held is None:
            held = self._find(session)
        if held is None or held.engine.address != endpoint or not held.engine.alive:
            self.placed(endpoint, session, tokens, (), now)
            return
        engine = held.engine
        if held.resident:
            engine.order.move_to_end(session)
        else:
            engine.order[session] = held
            held.resident = True
        if tokens != held.tokens:
            held.tokens = tokens
            held.own = max(0, tokens - held.shared)
        engine.total += held.own - held.held
        held.held = held.own
        if engine.total > engine.limit:
            self._evict(engine)

    def placed(self, endpoint: str, session: str, tokens: int, blocks: Sequence[int],
               now: float) -> None:
        """`session` placed on `endpoint` (new, or moved there) with its context (`tokens`)
        and its prompt's leading `blocks` where known. What it held on another engine stays
        there, in that engine's order, until evicted."""
        self._now = now
        engine = self._engines.get(endpoint)
        if engine is None:
            engine = self._engines[endpoint] = _Engine(endpoint, self.capacity)
        shared = self._shared(engine, blocks)
        stale = engine.order.pop(session, None)  # an earlier stay there
        if stale is not None:
            engine.total -= stale.held
            stale.resident = False
        held = _Held(engine, tokens, shared)
        engine.order[session] = held
        engine.total += held.own
        self._where.put(session, held)
        if engine.total > engine.limit:
            self._evict(engine)

    def _shared(self, engine: _Engine, blocks: Sequence[int]) -> int:
        """Tokens of `blocks` every session placed on `engine` shares (0 for the first);
        the engine's common prefix updated."""
        size = self.block_tokens
        if not blocks or not size:
            return 0
        common = engine.common
        if common is None:
            engine.common = list(blocks)
            return 0
        n = _common_length(common, blocks)
        if n < len(common):
            del common[n:]
        engine.shared = n * size
        engine.limit = max(0, self.capacity - engine.shared)
        return engine.shared

    @staticmethod
    def _evict(engine: _Engine) -> None:
        """Past capacity (less the shared prefix), the least recently used sessions' tokens
        are evicted, each session's last tokens first."""
        over = engine.total - engine.limit
        order = engine.order
        while over > 0 and order:
            head = next(iter(order.values()))
            if head.held <= over:
                over -= head.held
                engine.total -= head.held
                engine.evicted += head.held
                head.held = 0
                head.resident = False
                order.popitem(last=False)
            else:
                head.held -= over
                engine.total -= over
                engine.evicted += over
                over = 0

    def _there(self, endpoint: str, session: str) -> _Held | None:
        """The session's record, if last routed to `endpoint` (and not forgotten)."""
        held = self._where.current.get(session)
        if held is None:
            held = self._where.find(session, None)
        if held is None or held.engine.address != endpoint or not held.engine.alive:
            return None
        return held

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        """See `kvgate.placement.signals.HbmResidency`: the share of its context (the gate's
        units, as recorded) its own part still held and its shared prefix are; None: not
        routed there by this gateway (or forgotten)."""
        held = self._there(endpoint, session)
        if held is None:
            return None
        if held.held >= held.own or held.tokens <= 0:
            return 1.0
        return (held.shared + held.held) / held.tokens

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        """See `kvgate.placement.signals.HbmResidency`: of `context_tokens`, that share
        (:meth:`hbm_share`)."""
        held = self._there(endpoint, session)
        if held is None:
            return None
        if held.held >= held.own:
            return context_tokens
        return min(context_tokens, context_tokens * (held.shared + held.held) // held.tokens)

    def eviction_rate(self, endpoint: str) -> float | None:
        """See `kvgate.placement.signals.HbmResidency`: blocks (of `block_tokens`, else
        tokens) estimated evicted per second over about the last minute."""
        engine = self._engines.get(endpoint)
        if engine is None:
            return None
        engine.rate.sample(self._now, engine.evicted // (self.block_tokens or 1))
        return engine.rate.per_s()

    def shared(self, endpoint: str) -> int:
        """Tokens of the prefix every session placed on `endpoint` shares, as held once."""
        engine = self._engines.get(endpoint)
        return 0 if engine is None else engine.shared

    def forget(self, endpoint: str) -> None:
        """`endpoint` left the fleet: nothing of it is known any more."""
        engine = self._engines.pop(endpoint, None)
        if engine is not None:
            engine.alive = False


def _common_length(common: Sequence[int], blocks: Sequence[int]) -> int:
    """How many leading entries the two share."""
    n = min(len(common), len(blocks))
    if common[:n] == blocks[:n]:
        return n
    low, high = 0, n  # common[:low] == blocks[:low]; common[:high] differs
    while high - low > 1:
        mid = (low + high) // 2
        if common[:mid] == blocks[:mid]:
            low = mid
        else:
            high = mid
    return low
