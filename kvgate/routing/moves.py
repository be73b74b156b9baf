"""What a bound session's turn is priced with when the gate reconsiders it (kvgate.routing.gated,
`GatedPolicy.reconsider`): re-homing off an engine whose HBM evicts its context (`rehome`) and a
move to a DDR-pool sibling that answers sooner by enough (`move`). The gate decides; these price.

- A bound session stays unless a sibling in its DDR pool would answer sooner by more than
  `min_saving_s` and `min_saving_ratio` of its engine's estimate: there, its context costs only
  a DDR read, which overlaps the sibling's queue. With `miss_safe` (the default) the move must
  also be no slower if the pool has lost the context and the sibling prefills it all (a pool
  evicts a long session's early blocks while they live in HBM; it can be down). Where what the
  pool holds of the session is known (a `PoolResidency`), the move is priced with exactly that
  read from DDR and the rest prefilled, and `miss_safe` has nothing left to guard. Where what
  its engine's HBM still holds is known (an `HbmResidency`, from the engine's KV events),
  staying is priced with that: a context that has left HBM comes back from the pool there too,
  so a move costs no hit rate.
- Where that residency is known, a bound session whose context has mostly left its engine's
  HBM is re-homed to the DDR-pool sibling that evicts slowest (`rehome`), if it evicts at most
  half as fast and answers no later than staying, give or take re-reading what is still held:
  the context comes back from the pool either way, and an engine that evicts fast will evict it
  again before the session's next turn. Without it, a few engines whose HBM thrashes keep
  reloading their sessions' contexts turn after turn (docs/pool-profiles.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from kvgate.bindings.model import MoveEstimate
from kvgate.config.sections.placement import GateConfig
from kvgate.placement.cost import EngineCost
from kvgate.placement.pick import LoadBound
from kvgate.placement.signals import EngineSignals
from kvgate.placement.terms import Candidate, Estimate
from kvgate.routing.policy import HbmResidency, Known, Placing, PoolResidency, PromptSize


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


class Pricer(Protocol):
    """What pricing a move asks of the gate (GatedPolicy)."""

    config: GateConfig
    cost: EngineCost
    estimate: Estimate
    residency: PoolResidency | None

    @property
    def hbm(self) -> HbmResidency | None: ...

    def engine(self, address: str, now: float, backlog_s: float | None = None
               ) -> EngineSignals: ...

    def score(self, address: str, now: float, size: PromptSize, *, hbm_tokens: int = 0,
              ddr_tokens: int = 0) -> float: ...

    def landing(self, address: str, now: float, size: PromptSize, ddr_tokens: int,
                blocks: Sequence[int]) -> Candidate: ...

    def held(self, endpoint: str, known: Known, context: int) -> int | None: ...

    def scored(self, found: Iterable[str]) -> Iterator[str]: ...

    def explaining(self) -> FilteringBoundLogger | None: ...


def rehome(gate: Pricer, placing: Placing, current: str, known: Known) -> Move | None:
    """The DDR-pool sibling a session whose context has mostly left `current`'s HBM should
    move to, where it will stay longer: the one evicting slowest, at most
    `REHOME_RATE_RATIO` of `current`'s rate, whose estimate is no later than staying's
    plus the read of what `current` still holds (with the two estimates). None: it
    stays."""
    hbm, seen, now = gate.hbm, known.seen, known.now
    # From the tuple, not `known.size`: the sticky path makes no object (Ledger.kept).
    context = 0 if seen is None else seen.tokens
    if hbm is None or context <= 0:
        return None
    held = gate.held(current, known, context)
    if held is None or held >= REHOME_HELD_BELOW * context:
        return None
    size = known.size
    rate = hbm.eviction_rate(current)
    if not rate:  # unknown, or it evicts nothing: its HBM is not why the context left
        return None
    siblings = ddr_siblings(placing, current)
    if siblings is None:
        return None
    here = Candidate(gate.engine(current, now), size.prompt_tokens, hbm_tokens=held,
                     ddr_tokens=context - held)
    stay = gate.estimate.seconds(here)
    limit = stay + gate.cost.transfer_s(held)
    best, best_rate, best_s = None, REHOME_RATE_RATIO * rate, 0.0
    for address in gate.scored(siblings):
        sibling_rate = hbm.eviction_rate(address)
        if sibling_rate is not None and sibling_rate < best_rate:
            seconds = gate.score(address, now, size, ddr_tokens=context)
            if seconds <= limit:
                best, best_rate, best_s = address, sibling_rate, seconds
    if best is None:
        return None
    terms = gate.estimate.parts(Candidate(gate.engine(best, now), size.prompt_tokens,
                                          ddr_tokens=context))
    log = gate.explaining()
    if log is not None:
        log.debug("gate_rehomed", session=known.session, endpoint=best,
                  stay_terms=gate.estimate.parts(here), terms=terms)
    return Move(best, stay, best_s, tuple(terms.items()))

def move(gate: Pricer, placing: Placing, current: str, backlog: float, known: Known
         ) -> Move | None:
    """The DDR-pool sibling a session on `current` (with `backlog` seconds queued) should
    move to, if moving saves enough; cooldown and threshold are `reconsider`'s."""
    config, now, size = gate.config, known.now, known.size
    siblings = ddr_siblings(placing, current)
    if siblings is None:
        return None
    kv_pool = placing.view.kv_pool_of(current)
    # What the pool holds of the context, where known: the sibling reads that and prefills
    # the rest, so the estimate is the move's own and needs no miss-safe doubt.
    held = (None if gate.residency is None or kv_pool is None
            else gate.residency.pool_tokens(kv_pool, known.session, size.context_tokens))
    ddr = size.context_tokens if held is None else held
    # What its engine's HBM still holds, where known; what left it comes back from the pool.
    in_hbm = gate.held(current, known, size.context_tokens)
    if in_hbm is None:
        in_hbm = size.context_tokens
    engine = gate.engine(current, now, backlog)
    here = Candidate(engine, size.prompt_tokens, hbm_tokens=in_hbm,
                     ddr_tokens=max(0, ddr - in_hbm))
    stay = gate.estimate.seconds(here)
    blocks = known.blocks
    best, best_s = least(
        (address, gate.estimate.seconds(gate.landing(address, now, size, ddr, blocks)))
        for address in gate.scored(siblings))
    if best is None:
        return None
    if not config.clears(stay - best_s, stay):
        return None
    if config.miss_safe and held is None and gate.score(best, now, size) > (
            stay if in_hbm >= size.context_tokens else gate.estimate.seconds(
                Candidate(engine, size.prompt_tokens, hbm_tokens=in_hbm))):
        # The pool may have lost the context (evicted, down, restarted): then the sibling
        # prefills it all, and so does this engine for what has left its HBM. Only a move
        # that is no worse even so is taken.
        return None
    terms = gate.estimate.parts(gate.landing(best, now, size, ddr, blocks))
    log = gate.explaining()
    if log is not None:
        log.debug("gate_moved", session=known.session, endpoint=best,
                  stay_s=round(stay, 6), stay_terms=gate.estimate.parts(here),
                  estimate_s=round(best_s, 6), terms=terms)
    return Move(best, stay, best_s, tuple(terms.items()))


def ddr_siblings(placing: Placing, current: str) -> Iterator[str] | None:
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


def least(scored: Iterable[tuple[str, float]]) -> tuple[str | None, float]:
    """The pick: the lowest estimate, the first of equals (ring order)."""
    best: str | None = None
    best_s = float("inf")
    for address, seconds in scored:
        if seconds < best_s:
            best, best_s = address, seconds
    return best, best_s
