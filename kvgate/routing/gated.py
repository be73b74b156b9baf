"""The load gate: filter → score → pick, with estimated TTFT (`kvgate.placement.terms`: the
named terms `placement.load_gate.terms` lists, each reading the engine's signals) as the score,
and the booking that keeps its load board and memory of sessions current. With a logger at
debug level, each placement and move is logged with its seconds per term.

- A new session is scored over its first `candidates` endpoints under the load bound in ring
  order (its KV pool's ring first), and goes to the least estimated TTFT; ties keep ring order,
  so with no load anywhere it lands where Envoy's ring would put it.
- A bound session is reconsidered on each turn: re-homed off an engine whose HBM evicts its
  context, or moved to a DDR-pool sibling that answers sooner by enough; both are priced in
  kvgate.routing.moves. A session that moved stays put for `cooldown_s` (hysteresis: no
  flapping between two busy siblings).
- A request with no session and a known size goes to the least estimated TTFT among
  `candidates` endpoints of the whole pool's ring, from a starting point that turns with each
  such request, and is booked there: an engine busy with a large sessionless prompt shows
  its backlog to the next decision. One of unknown size is left to Envoy's balancing, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

from structlog.typing import FilteringBoundLogger

from kvgate.config.sections.placement import ROUTED, GateConfig
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement.cost import EngineCost
from kvgate.placement.links import LinkBacklog, host_of
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import candidates
from kvgate.placement.prefix import PrefixHolders, RoutedPrefixes
from kvgate.placement.ring import session_hash
from kvgate.placement.routed_hbm import RoutedHbm
from kvgate.placement.signals import EngineSignals
from kvgate.placement.terms import Candidate, Estimate, QueuedDdrRead, Term, make_terms
from kvgate.placement.view import PoolView
from kvgate.routing import moves
from kvgate.routing.booking import Ledger
from kvgate.routing.hbm_estimate import RoutedHbmHook
from kvgate.routing.moves import Move, least
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
        if any(isinstance(term, QueuedDdrRead) for term in self.estimate.terms):
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

    def scored(self, found: Iterable[str]) -> Iterator[str]:
        """The candidates a decision scores: the first `candidates` of a ring walk."""
        return islice(found, self.config.candidates)

    def explaining(self) -> FilteringBoundLogger | None:
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
        best, best_s = least(
            (address, self.estimate.seconds(self.landing(address, now, size, ddr(address),
                                                         blocks)))
            for address in scored)
        log = self.explaining()
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
        best, best_s = least((address, self.score(address, now, size))
                             for address in self.scored(whole.ring.walk(start)))
        if best is None:
            return None
        self._ledger.sessionless(best, now, prompt_tokens)
        log = self.explaining()
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

    def held(self, endpoint: str, known: Known, context: int) -> int | None:
        """What `endpoint`'s HBM holds of `context`, in the gate's units (held_context)."""
        return self._ledger.held(endpoint, known, context)

    def rehome(self, placing: Placing, current: str, known: Known) -> Move | None:
        """Where a session whose context has mostly left `current`'s HBM should move
        (kvgate.routing.moves.rehome); None: it stays."""
        return moves.rehome(self, placing, current, known)

    def move(self, placing: Placing, current: str, backlog: float, known: Known) -> Move | None:
        """Where a session on `current` (with `backlog` seconds queued) should move for load,
        if moving saves enough (kvgate.routing.moves.move)."""
        return moves.move(self, placing, current, backlog, known)


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
