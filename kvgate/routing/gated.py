"""The load gate: filter → score → pick, with estimated TTFT (`kvgate.placement.terms`: the
named terms `placement.load_gate.terms` lists, each reading the engine's signals) as the score,
and the booking that keeps its load board and memory of sessions current. With a logger at
debug level, each placement and move is logged with its seconds per term.

- A new session is scored over its first `candidates` endpoints under the load bound in ring
  order (its KV pool's ring first), and goes to the least estimated TTFT; ties keep ring order,
  so with no load anywhere it lands where Envoy's ring would put it.
- A bound session stays unless a sibling in its DDR pool would answer sooner by more than
  `min_saving_s` and `min_saving_ratio` of its engine's estimate: there, its context costs only
  a DDR read, which overlaps the sibling's queue. With `miss_safe` (the default) the move must
  also be no slower if the pool has lost the context and the sibling prefills it all (a pool
  evicts a long session's early blocks while they live in HBM; it can be down). Where what the
  pool holds of the session is known (a `PoolResidency`), the move is priced with exactly that
  read from DDR and the rest prefilled, and `miss_safe` has nothing left to guard. Where what
  its engine's HBM still holds is known (an `HbmResidency`, from the engine's KV events),
  staying is priced with that: a context that has left HBM comes back from the pool there too,
  so a move costs no hit rate. A session that moved stays put for `cooldown_s` (hysteresis: no
  flapping between two busy siblings).
- Where that residency is known, a bound session whose context has mostly left its engine's
  HBM is re-homed to the DDR-pool sibling that evicts slowest (`rehome`), if it evicts at most
  half as fast and answers no later than staying, give or take re-reading what is still held:
  the context comes back from the pool either way, and an engine that evicts fast will evict it
  again before the session's next turn. Without it, a few engines whose HBM thrashes keep
  reloading their sessions' contexts turn after turn (docs/pool-profiles.md).
- A request with no session and a known size goes to the least estimated TTFT among
  `candidates` endpoints of the whole pool's ring, from a starting point that turns with each
  such request, and is booked there: an engine busy with a large sessionless prompt shows
  its backlog to the next decision. One of unknown size is left to Envoy's balancing, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from structlog.typing import FilteringBoundLogger

from kvgate.bindings.model import MoveEstimate
from kvgate.config.sections.placement import ROUTED, GateConfig
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement.cost import EngineCost
from kvgate.placement.links import LinkBacklog, host_of
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import LoadBound, candidates
from kvgate.placement.prefix import PrefixHolders, RoutedPrefixes
from kvgate.placement.ring import session_hash
from kvgate.placement.routed_hbm import RoutedHbm
from kvgate.placement.signals import EngineSignals, held_context
from kvgate.placement.terms import Candidate, Estimate, QueuedDdrRead, Term, make_terms
from kvgate.placement.view import PoolView
from kvgate.routing.booking import Ledger
from kvgate.routing.hbm_estimate import RoutedHbmHook
from kvgate.routing.policy import (
    BookingHook,
    HbmResidency,
    Known,
    Moved,
    Placing,
    PoolResidency,
    PromptSize,
)
from kvgate.routing.prefixes import PrefixStep
from kvgate.routing.recent import RecentSessions


@dataclass(frozen=True, slots=True)
class Move:
    """The gate's verdict for a bound session that should move: where, and the two estimates
    (`terms`: the move's, per scoring term)."""

    endpoint: str
    stay_s: float
    move_s: float
    terms: tuple[tuple[str, float], ...] = ()

    @property
    def estimate(self) -> MoveEstimate:
        return MoveEstimate(self.terms, round(self.stay_s, 6))


class GatedPolicy:
    """Scores endpoints by estimated TTFT from a :class:`LoadBoard`; books what it routes."""

    def __init__(
        self, cost: EngineCost, config: GateConfig, board: LoadBoard, *,
        clock: Callable[[], float] = time.monotonic, recent: RecentSessions | None = None,
        mix: PrefillMix | None = None, terms: Sequence[Term] | None = None,
        residency: PoolResidency | None = None, hbm: HbmResidency | None = None,
        log: FilteringBoundLogger | None = None, node_of: Callable[[str], str] = host_of,
        prefixes: PrefixHolders | None = None, block_tokens: int | None = None,
    ) -> None:
        """`terms`: the score's terms (default: `config.terms`); `log`: where a decision's
        seconds per term go, at debug level (None: nowhere); `node_of`: an engine's node, whose
        link from the pool its devices share (where a term reads the links' backlog);
        `prefixes`: where prompts' leading blocks are held, exactly, for
        `config.prefix_placement` (None: an index of what it placed, of `block_tokens`-token
        blocks; kvgate.routing.prefixes)."""
        self.cost = cost
        self.config = config
        self.board = board
        board.from_reports = config.board_from_reports
        self.clock = clock  # the load board's clock
        self.recent = recent if recent is not None else RecentSessions()
        self.mix = mix if mix is not None else PrefillMix()  # what booked requests cost
        self.estimate = Estimate(make_terms(config.terms, cost) if terms is None else terms)
        self._ledger = Ledger(cost, board, self.recent, self.mix)
        self.hooks: tuple[BookingHook, ...] = (self._ledger,)
        if any(term.name == QueuedDdrRead.name for term in self.estimate.terms):
            # The reads it books queue on the links, which the term prices.
            self._ledger.links = LinkBacklog(cost, node_of)
        step = _prefix_step(config, prefixes, block_tokens)
        self._prefixes = step  # recorded (the index) and forgotten, whoever reads it
        self.prefix = step if config.prefix_placement else None  # what placement weighs
        self.reads_prompts = step is not None  # both uses need a placed prompt's blocks
        if step is not None and config.book_uncached_prefill:
            self._ledger.prefix = step  # reads what is held, then records (routed only)
        elif step is not None:
            self.hooks = (*self.hooks, step)
        self.residency = residency
        if hbm is None and config.hbm_estimate == ROUTED:  # no KV events: estimate them
            estimate = RoutedHbm(cost.hbm_tokens, block_tokens)
            hbm, self.hooks = estimate, (*self.hooks, RoutedHbmHook(estimate))
            self.reads_prompts = True  # a placement's blocks give the shared prefix
        self.hbm = hbm
        self._ledger.block_tokens = block_tokens  # `Known.blocks`' size (held_context)
        self._log = log
        self._sessionless = 0  # requests with no session routed: where their ring walk starts

    @property
    def hbm(self) -> HbmResidency | None:
        """What each engine's HBM holds of a session, where known: prices staying (`move`)
        and what a kept request books (the ledger)."""
        return self._ledger.hbm

    @hbm.setter
    def hbm(self, hbm: HbmResidency | None) -> None:
        self._ledger.hbm = hbm

    def known(self, pool: str, session: str, prompt_tokens: int) -> Known:
        return Known(self.clock(), prompt_tokens, self.recent.get(pool, session), session)

    @property
    def links(self) -> LinkBacklog | None:
        """The DDR reads it booked on each device's and node's link, where a term prices them."""
        return self._ledger.links

    def forget(self, address: str) -> None:
        self.board.forget(address)
        if self.links is not None:
            self.links.forget(address)
        if self._prefixes is not None:
            self._prefixes.forget(address)
        if isinstance(self.hbm, RoutedHbm):
            self.hbm.forget(address)

    def engine(self, address: str, now: float, backlog_s: float | None = None
               ) -> EngineSignals:
        """`address`'s signals at `now` (`backlog_s`: the board's, if already read)."""
        return EngineSignals(address, now, self.board, self.hbm, backlog_s, self._ledger.links)

    def score(self, address: str, now: float, size: PromptSize, *, hbm_tokens: int = 0,
              ddr_tokens: int = 0) -> float:
        """Estimated TTFT of a request of `size` sent to `address` at `now`."""
        return self.estimate.seconds(Candidate(
            self.engine(address, now), size.prompt_tokens, hbm_tokens, ddr_tokens))

    def landing(self, address: str, now: float, size: PromptSize, ddr_tokens: int,
                blocks: Sequence[int]) -> Candidate:
        """A request of `size` placed or moved to `address`: its context read from DDR
        (`ddr_tokens`), less what the engine already holds of its prompt's leading blocks
        (the prefix step, where on and the blocks are known)."""
        step = self.prefix
        held = 0 if step is None else step.held(address, blocks, size.prompt_tokens)
        return Candidate(self.engine(address, now), size.prompt_tokens, hbm_tokens=held,
                         ddr_tokens=max(0, ddr_tokens - held))

    def _explaining(self) -> FilteringBoundLogger | None:
        log = self._log
        return log if log is not None and log.is_enabled_for(logging.DEBUG) else None

    def place(self, placing: Placing, known: Known, *, prefer_kv_pool: str | None,
              exclude: str | None) -> str | None:
        """The least estimated TTFT among the first candidates under the load bound."""
        p = placing
        found = candidates(p.view, p.hash_value, p.loads, p.load_factor,
                           prefer_kv_pool=prefer_kv_pool, exclude=exclude)
        if not self.config.enabled:
            return next(found, None)
        now, size = self.clock(), known.size  # placed once its turn to write comes
        view = p.view

        blocks, count, step = known.blocks, self.config.candidates, self.prefix
        # What each KV pool holds of the prompt's leading blocks (the prefix step's).
        pooled = {} if step is None else step.pooled(view, blocks, size.prompt_tokens)

        def ddr(address: str) -> int:
            # Re-placed within its KV pool, the session's context is read from DDR there; a
            # prefix its pool holds is too.
            kv_pool = view.kv_pool_of(address)
            context = (size.context_tokens if prefer_kv_pool is not None
                       and kv_pool == prefer_kv_pool else 0)
            return (max(context, pooled.get(kv_pool, 0)) if pooled and kv_pool is not None
                    else context)

        scored = (islice(found, count) if step is None or not blocks
                  else step.candidates(found, count, blocks, size.prompt_tokens))
        best, best_s = _least(
            (address, self.estimate.seconds(self.landing(address, now, size, ddr(address),
                                                         blocks)))
            for address in scored)
        log = self._explaining()
        if log is not None and best is not None:
            log.debug("gate_placed", session=known.session, endpoint=best,
                      estimate_s=round(best_s, 6), terms=self.estimate.parts(
                          self.landing(best, now, size, ddr(best), blocks)))
        return best

    def sessionless(self, view: PoolView, prompt_tokens: int) -> str | None:
        """The least estimated TTFT among the first candidates of the whole pool's ring, from
        a point that turns request by request (no session to keep in one place); booked."""
        whole = view.ring_for(None, None)
        if not self.config.enabled or prompt_tokens <= 0 or whole is None:
            return None
        self._sessionless += 1
        start = session_hash(self._sessionless.to_bytes(8, "big"))
        now, size = self.clock(), PromptSize(prompt_tokens)
        best, best_s = _least((address, self.score(address, now, size))
                              for address in islice(whole.ring.walk(start),
                                                    self.config.candidates))
        if best is None:
            return None
        self._ledger.sessionless(best, now, prompt_tokens)
        log = self._explaining()
        if log is not None:
            log.debug("gate_sessionless", endpoint=best, estimate_s=round(best_s, 6),
                      terms=self.estimate.parts(Candidate(self.engine(best, now),
                                                          prompt_tokens)))
        return best

    def reconsider(self, placing: Placing, endpoint: str, state: EndpointState,
                   known: Known) -> Moved | None:
        """A DDR-pool sibling that answers sooner by enough (or, its context evicted, keeps it
        longer: `rehome`), for a session on an active endpoint; None: it stays."""
        config, now = self.config, known.now
        if state is not EndpointState.ACTIVE or not config.enabled:
            return None
        moved_at = None if known.seen is None else known.seen.moved_at
        if config.cooling(moved_at, now):
            return None
        if self.hbm is not None:
            home = self.rehome(placing, endpoint, known)
            if home is not None:
                return Moved(home.endpoint, MoveReason.EVICTED, home.estimate)
        # Moving saves at most this engine's backlog (the prefill is the same anywhere): under
        # the threshold nothing else is looked at, so the sticky path stays O(1).
        backlog = self.board.backlog_s(endpoint, now)
        if backlog < config.min_saving_s and (self._ledger.links is None
                                               or not self._link_bound(endpoint, now)):
            return None
        move = self.move(placing, endpoint, backlog, known)
        return None if move is None else Moved(move.endpoint, MoveReason.LOAD, move.estimate)

    def _link_bound(self, endpoint: str, now: float) -> bool:
        """Staying may wait on `endpoint`'s links more than a move must save: its HBM lost part
        of the context (known from its KV events) and reads booked there are not through."""
        links = self._ledger.links
        return (links is not None and self.hbm is not None
                and links.wait_s(endpoint, now) >= self.config.min_saving_s)

    def _held(self, endpoint: str, known: Known, context: int) -> int | None:
        """What `endpoint`'s HBM holds of `context`, in the gate's units (held_context)."""
        hbm = self.hbm
        return None if hbm is None else held_context(
            hbm.hbm_tokens, endpoint, known.session, context, known.prompt_tokens,
            len(known.blocks), self._ledger.block_tokens)

    def rehome(self, placing: Placing, current: str, known: Known) -> Move | None:
        """The DDR-pool sibling a session whose context has mostly left `current`'s HBM should
        move to, where it will stay longer: the one evicting slowest, at most
        `REHOME_RATE_RATIO` of `current`'s rate, whose estimate is no later than staying's
        plus the read of what `current` still holds (with the two estimates). None: it
        stays."""
        hbm, seen, now = self.hbm, known.seen, known.now
        # From the tuple, not `known.size`: the sticky path makes no object (Ledger.kept).
        context = 0 if seen is None else seen.tokens
        if hbm is None or context <= 0:
            return None
        held = self._held(current, known, context)
        if held is None or held >= REHOME_HELD_BELOW * context:
            return None
        size = known.size
        rate = hbm.eviction_rate(current)
        if not rate:  # unknown, or it evicts nothing: its HBM is not why the context left
            return None
        siblings = _ddr_siblings(placing, current)
        if siblings is None:
            return None
        here = Candidate(self.engine(current, now), size.prompt_tokens, hbm_tokens=held,
                         ddr_tokens=context - held)
        stay = self.estimate.seconds(here)
        limit = stay + self.cost.transfer_s(held)
        best, best_rate, best_s = None, REHOME_RATE_RATIO * rate, 0.0
        for address in islice(siblings, self.config.candidates):
            sibling_rate = hbm.eviction_rate(address)
            if sibling_rate is not None and sibling_rate < best_rate:
                seconds = self.score(address, now, size, ddr_tokens=context)
                if seconds <= limit:
                    best, best_rate, best_s = address, sibling_rate, seconds
        if best is None:
            return None
        terms = self.estimate.parts(Candidate(self.engine(best, now), size.prompt_tokens,
                                              ddr_tokens=context))
        log = self._explaining()
        if log is not None:
            log.debug("gate_rehomed", session=known.session, endpoint=best,
                      stay_terms=self.estimate.parts(here), terms=terms)
        return Move(best, stay, best_s, tuple(terms.items()))

    def move(self, placing: Placing, current: str, backlog: float, known: Known) -> Move | None:
        """The DDR-pool sibling a session on `current` (with `backlog` seconds queued) should
        move to, if moving saves enough; cooldown and threshold are `reconsider`'s."""
        config, now, size = self.config, known.now, known.size
        siblings = _ddr_siblings(placing, current)
        if siblings is None:
            return None
        kv_pool = placing.view.kv_pool_of(current)
        # What the pool holds of the context, where known: the sibling reads that and prefills
        # the rest, so the estimate is the move's own and needs no miss-safe doubt.
        held = (None if self.residency is None or kv_pool is None
                else self.residency.pool_tokens(kv_pool, known.session, size.context_tokens))
        ddr = size.context_tokens if held is None else held
        # What its engine's HBM still holds, where known; what left it comes back from the pool.
        in_hbm = self._held(current, known, size.context_tokens)
        if in_hbm is None:
            in_hbm = size.context_tokens
        engine = self.engine(current, now, backlog)
        here = Candidate(engine, size.prompt_tokens, hbm_tokens=in_hbm,
                         ddr_tokens=max(0, ddr - in_hbm))
        stay = self.estimate.seconds(here)
        blocks = known.blocks
        best, best_s = _least(
            (address, self.estimate.seconds(self.landing(address, now, size, ddr, blocks)))
            for address in islice(siblings, config.candidates))
        if best is None:
            return None
        if not config.clears(stay - best_s, stay):
            return None
        if config.miss_safe and held is None and self.score(best, now, size) > (
                stay if in_hbm >= size.context_tokens else self.estimate.seconds(
                    Candidate(engine, size.prompt_tokens, hbm_tokens=in_hbm))):
            # The pool may have lost the context (evicted, down, restarted): then the sibling
            # prefills it all, and so does this engine for what has left its HBM. Only a move
            # that is no worse even so is taken.
            return None
        terms = self.estimate.parts(self.landing(best, now, size, ddr, blocks))
        log = self._explaining()
        if log is not None:
            log.debug("gate_moved", session=known.session, endpoint=best,
                      stay_s=round(stay, 6), stay_terms=self.estimate.parts(here),
                      estimate_s=round(best_s, 6), terms=terms)
        return Move(best, stay, best_s, tuple(terms.items()))


def _ddr_siblings(placing: Placing, current: str) -> Iterator[str] | None:
    """`current`'s siblings in its DDR pool under the whole pool's load bound, in ring order;
    None: no sibling shares its DDR pool."""
    view = placing.view
    kv_pool = view.kv_pool_of(current)
    same_kv = view.ring_for(kv_pool, current) if kv_pool is not None else None
    whole = view.ring_for(None, None)
    if same_kv is None or whole is None or same_kv is whole:
        return None
    bound = LoadBound(view, whole, placing.loads, placing.load_factor, extra=0)
    return (a for a in same_kv.ring.walk(placing.hash_value)
            if a != current and bound.admits(a))


# rehome: the context has mostly left its engine's HBM (less than this share still there) ...
REHOME_HELD_BELOW = 0.5
# ... and a sibling evicts at most this share as fast.
REHOME_RATE_RATIO = 0.5


def _least(scored: Iterable[tuple[str, float]]) -> tuple[str | None, float]:
    """The pick: the lowest estimate, the first of equals (ring order)."""
    best: str | None = None
    best_s = float("inf")
    for address, seconds in scored:
        if seconds < best_s:
            best, best_s = address, seconds
    return best, best_s


def _prefix_step(config: GateConfig, exact: PrefixHolders | None,
                 block_tokens: int | None) -> PrefixStep | None:
    """The prefix step when `config.prefix_placement` or `config.book_uncached_prefill` is
    on: over the engines' own holdings where known, else over an index of what this router
    placed (`prefix_index_blocks`)."""
    if not (config.prefix_placement or config.book_uncached_prefill):
        return None
    if exact is not None:
        return PrefixStep(exact)
    if block_tokens is None:
        return None
    return PrefixStep(RoutedPrefixes(config.prefix_index_blocks, block_tokens))
