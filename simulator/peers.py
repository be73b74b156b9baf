"""The peers' routing policies, as their public sources define them, on kvgate's simulated fleet
(same engines, same DDR pool: the comparison is about routing only). None binds sessions;
each sees what its router really has: the requests it sent (an approximate prefix index, the
streams it is serving) and the engines' metrics as last scraped. None knows the DDR pool: to
each of them an engine that never saw a prompt holds none of it.

- ``prefix-score``: the Gateway API Inference Extension / llm-d endpoint picker's default
  scoring (prefix-cache-scorer ×3, queue-scorer ×2, kv-cache-utilization-scorer ×2,
  max-score picker), behind llm-d's prefix-cache-affinity-filter (threshold 0.80,
  exploration 1 %, maxTTFTPenaltyMs 5000 with TTFT = in-flight uncached tokens ÷ peak
  prefill throughput).
- ``kv-cost``: Dynamo's KV router, cost = overlap_score_weight (1.0) × prefill blocks to
  compute + active decode blocks (the worker's in-flight requests' blocks and this one's),
  lowest cost at temperature 0.
- ``bounded-hash``: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam
  2018) on the session id over Envoy's ring: the first engine whose in-flight requests are
  under c = 1.25 × the mean.
docs/benchmarks.md gives each one's sources.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence

from kvgate.contract.modes import RoutingMode
from kvgate.contract.states import EndpointState
from kvgate.placement import EnvoyRing, session_hash
from simulator.observe import Scrape
from simulator.prefix_index import PrefixIndex
from simulator.routing import Ask, Metrics, Router, RouterSetup


class _InFlight:
    """Per engine, what the router sent and has not yet seen finish: requests, and a per-request
    quantity summed (uncached tokens, blocks). Entries leave at their stream's end."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.amount: dict[str, float] = {}
        self._ends: list[tuple[float, int, str, float]] = []
        self._seq = 0

    def add(self, address: str, amount: float, finish: float) -> None:
        self.requests[address] = self.requests.get(address, 0) + 1
        self.amount[address] = self.amount.get(address, 0.0) + amount
        heapq.heappush(self._ends, (finish, self._seq, address, amount))
        self._seq += 1

    def enters(self, address: str, amount: float) -> None:
        """:meth:`add` without its end, which :meth:`leaves` gives once known."""
        self.requests[address] = self.requests.get(address, 0) + 1
        self.amount[address] = self.amount.get(address, 0.0) + amount

    def leaves(self, address: str, amount: float, finish: float) -> None:
        heapq.heappush(self._ends, (finish, self._seq, address, amount))
        self._seq += 1

    def advance(self, now: float) -> None:
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, _, address, amount = heapq.heappop(ends)
            if address in self.requests:
                self.requests[address] -= 1
                self.amount[address] -= amount

    def forget(self, address: str) -> None:
        self.requests.pop(address, None)
        self.amount.pop(address, None)


class _Peer:
    """What every peer has: the active engines, the last scrapes, the streams in flight."""

    def __init__(self, addresses: Sequence[str], setup: RouterSetup, metrics: Metrics,
                 seed: int = 0) -> None:
        self._all = list(addresses)
        self._active = list(addresses)
        self._states: dict[str, EndpointState] = {}
        self.setup = setup
        self.metrics = metrics
        self.inflight = _InFlight()
        self.rng = random.Random(seed)
        # id of an Ask -> (the Ask, what it adds to its engine's in-flight amount)
        self._pending: dict[int, tuple[Ask, float]] = {}
        # ... of those counted in flight before their stream's end was known (``queued``)
        self._queued: dict[int, tuple[Ask, float]] = {}

    def set_state(self, address: str, state: EndpointState) -> None:
        self._states[address] = state
        self._active = [a for a in self._all
                        if self._states.get(a, EndpointState.ACTIVE) is EndpointState.ACTIVE]
        if state is EndpointState.FAILED:
            self.inflight.forget(address)

    def _candidates(self, now: float) -> list[str]:
        """The active engines, with the streams in flight brought up to ``now``; empty when
        there is none (the request then goes nowhere, and nothing is advanced)."""
        if not self._active:
            return []
        self.inflight.advance(now)
        return self._active

    def _fresh(self, address: str, now: float) -> Scrape | None:
        scrape = self.metrics.scrape(address, now)
        return None if scrape is None or now - scrape.at > self.setup.max_age_s else scrape

    def answered(self, address: str, ask: Ask, first_token: float, finish: float) -> None:
        queued = self._queued.pop(id(ask), None) if self._queued else None
        if queued is not None and queued[0] is ask:  # counted since it was sent
            self.inflight.leaves(address, queued[1], finish)
            return
        pending = self._pending.pop(id(ask), None)
        amount = pending[1] if pending is not None and pending[0] is ask else 0.0
        self.inflight.add(address, amount, finish)

    def queued(self, address: str, ask: Ask) -> None:
        """Counted in flight from now, as a router counts what it sent; its end comes with
        ``answered``."""
        pending = self._pending.pop(id(ask), None)
        amount = pending[1] if pending is not None and pending[0] is ask else 0.0
        self.inflight.enters(address, amount)
        self._queued[id(ask)] = (ask, amount)

    def _sent(self, ask: Ask, amount: float) -> None:
        self._pending[id(ask)] = (ask, amount)

    def _argbest(self, scores: dict[str, float], lowest: bool) -> str:
        best = min(scores.values()) if lowest else max(scores.values())
        tied = [a for a, s in scores.items() if s == best]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)


class _IndexedPeer(_Peer):
    """A peer that remembers which blocks it sent where (its approximate prefix index); a failed
    engine's blocks are forgotten."""

    def __init__(self, addresses: Sequence[str], setup: RouterSetup, metrics: Metrics) -> None:
        super().__init__(addresses, setup, metrics)
        self.index = PrefixIndex(setup.index_blocks)

    def set_state(self, address: str, state: EndpointState) -> None:
        super().set_state(address, state)
        if state is EndpointState.FAILED:
            self.index.forget(address)


class PrefixScoreRouter(_IndexedPeer):
    """llm-d / Gateway API Inference Extension endpoint picker (see the module's docstring)."""

    PREFIX_WEIGHT, QUEUE_WEIGHT, KV_WEIGHT = 3.0, 2.0, 2.0
    AFFINITY_THRESHOLD = 0.80
    EXPLORATION = 0.01
    MAX_TTFT_PENALTY_S = 5.0

    async def route(self, ask: Ask, now: float) -> str | None:
        candidates = self._candidates(now)
        if not candidates:
            return None
        hashes = ask.hashes
        total = len(hashes)
        match = {a: self.index.match(a, hashes) for a in candidates}
        prefix = {a: (match[a] / total if total else 0.0) for a in candidates}
        candidates = self._affinity_filter(candidates, prefix, match, ask)
        waiting = {}
        usage = {}
        for a in candidates:
            scrape = self._fresh(a, now)
            waiting[a] = 0 if scrape is None else scrape.figures.waiting
            usage[a] = 0.0 if scrape is None else scrape.figures.kv_usage
        low, high = min(waiting.values()), max(waiting.values())
        scores = {}
        for a in candidates:
            queue = 1.0 if high == low else (high - waiting[a]) / (high - low)
            scores[a] = (self.PREFIX_WEIGHT * prefix[a] + self.QUEUE_WEIGHT * queue
                         + self.KV_WEIGHT * (1.0 - usage[a]))
        chosen = self._argbest(scores, lowest=False)
        self.index.record(chosen, hashes)
        self._sent(ask, self._uncached(ask, match[chosen]))
        return chosen

    def _uncached(self, ask: Ask, matched_blocks: int) -> float:
        return max(0, ask.tokens - matched_blocks * self.setup.block_size)

    def _affinity_filter(self, candidates: list[str], prefix: dict[str, float],
                         match: dict[str, int], ask: Ask) -> list[str]:
        """prefix-cache-affinity-filter: keep the sticky endpoints unless the best of them
        would answer more than maxTTFTPenaltyMs after the best other one."""
        if len(candidates) <= 1 or self.rng.random() < self.EXPLORATION:
            return candidates
        sticky = [a for a in candidates if prefix[a] >= self.AFFINITY_THRESHOLD]
        others = [a for a in candidates if prefix[a] < self.AFFINITY_THRESHOLD]
        if not sticky or not others:
            return candidates
        rate = self.setup.cost.prefill_tokens_per_s  # the peak prefill throughput

        def ttft(a: str) -> float:
            return (self.inflight.amount.get(a, 0.0) + self._uncached(ask, match[a])) / rate

        if min(map(ttft, sticky)) - min(map(ttft, others)) > self.MAX_TTFT_PENALTY_S:
            return candidates
        return sticky


class KvCostRouter(_IndexedPeer):
    """Dynamo's KV router (see the module's docstring)."""

    OVERLAP_SCORE_WEIGHT = 1.0

    async def route(self, ask: Ask, now: float) -> str | None:
        candidates = self._candidates(now)
        if not candidates:
            return None
        hashes = ask.hashes
        blocks = math.ceil(ask.tokens / self.setup.block_size)
        active = self.inflight.amount
        costs = {}
        for a in candidates:
            prefill = max(0, blocks - self.index.match(a, hashes))
            costs[a] = self.OVERLAP_SCORE_WEIGHT * prefill + active.get(a, 0.0) + blocks
        chosen = self._argbest(costs, lowest=True)
        self.index.record(chosen, hashes)
        self._sent(ask, float(blocks))  # its decode blocks until it completes
        return chosen


class BoundedHashRouter(_Peer):
    """Consistent hashing with bounded loads on the session id (see the module's docstring)."""

    def __init__(self, addresses: Sequence[str], setup: RouterSetup, metrics: Metrics,
                 c: float = 1.25) -> None:
        super().__init__(addresses, setup, metrics)
        self.c = c
        self._ring = EnvoyRing([(a, 1) for a in self._active])

    async def route(self, ask: Ask, now: float) -> str | None:
        if not self._candidates(now):
            return None
        load = self.inflight.requests
        bound = math.ceil(self.c * (sum(load.values()) + 1) / len(self._active))
        for address in self._ring.walk(session_hash(ask.session.encode())):
            if load.get(address, 0) < bound:
                return address
        return None  # unreachable: some engine is always under c x the mean

    def set_state(self, address: str, state: EndpointState) -> None:
        super().set_state(address, state)
        self._ring = EnvoyRing([(a, 1) for a in self._active])


def make_peer(mode: RoutingMode, addresses: Sequence[str], setup: RouterSetup,
              load_factor: float, metrics: Metrics) -> Router:
    if mode is RoutingMode.PREFIX_SCORE:
        return PrefixScoreRouter(addresses, setup, metrics)
    if mode is RoutingMode.KV_COST:
        return KvCostRouter(addresses, setup, metrics)
    if mode is RoutingMode.BOUNDED_HASH:
        return BoundedHashRouter(addresses, setup, metrics, c=load_factor)
    raise ValueError(f"{mode} is not a peer's policy")
