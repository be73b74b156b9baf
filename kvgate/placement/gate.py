"""The load gate: filter → score → pick, with estimated TTFT as the score.

- A new session is scored over its first `candidates` endpoints under the load bound in ring
  order (its KV pool's ring first), and goes to the least estimated TTFT; ties keep ring order,
  so with no load anywhere it lands where Envoy's ring would put it.
- A bound session stays unless a sibling in its DDR pool would answer sooner by more than
  `min_saving_s` and `min_saving_ratio` of its engine's estimate: there, its context costs only
  a DDR read, which overlaps the sibling's queue. With `miss_safe` (the default) the move must
  also be no slower if the pool has lost the context and the sibling prefills it all (a pool
  evicts a long session's early blocks while they live in HBM; it can be down). A session that
  moved stays put for `cooldown_s` (hysteresis: no flapping between two busy siblings).

Pure: the caller passes the pool's view, the session counts, the live load and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice

from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import LoadBound, candidates
from kvgate.placement.view import PoolView


@dataclass(frozen=True, slots=True)
class GateConfig:
    """`placement.load_gate` in the YAML."""

    enabled: bool = True
    min_saving_s: float = 1.5  # more than a user notices; see docs/benchmarks.md
    min_saving_ratio: float = 0.3
    cooldown_s: float = 30.0
    candidates: int = 8  # endpoints scored per decision (ring order); 1: static ring placement
    # Move only if the move is no slower even when the pool no longer holds the context.
    miss_safe: bool = True

    def problems(self) -> list[str]:
        checks = (
            (self.min_saving_s >= 0, "min_saving_s must be >= 0"),
            (0 <= self.min_saving_ratio <= 1, "min_saving_ratio must be in 0..1"),
            (self.cooldown_s >= 0, "cooldown_s must be >= 0"),
            (self.candidates >= 1, "candidates must be >= 1"),
        )
        return [text for ok, text in checks if not ok]


@dataclass(frozen=True, slots=True)
class PromptSize:
    """What the router can tell of a request before it is sent (token estimates; 0 unknown)."""

    prompt_tokens: int = 0  # this request's prompt
    context_tokens: int = 0  # what its session's engine already holds of it (its last prompt)


@dataclass(frozen=True, slots=True)
class Move:
    """The gate's verdict for a bound session that should move: where, and the two estimates."""

    endpoint: str
    stay_s: float
    move_s: float


class LoadGate:
    """Scores endpoints by estimated TTFT from a :class:`LoadBoard` and an :class:`EngineCost`."""

    def __init__(self, cost: EngineCost, config: GateConfig, board: LoadBoard) -> None:
        self.cost = cost
        self.config = config
        self.board = board

    def estimate(self, address: str, now: float, size: PromptSize, *, hbm_tokens: int = 0,
                 ddr_tokens: int = 0) -> float:
        return self.cost.ttft_s(self.board.backlog_s(address, now), size.prompt_tokens,
                                hbm_tokens, ddr_tokens)

    def place(
        self, view: PoolView, hash_value: int, loads: Mapping[str, int], load_factor: float,
        now: float, size: PromptSize, *, prefer_kv_pool: str | None = None,
        exclude: str | None = None,
    ) -> str | None:
        """A new (or re-placed) session's endpoint: the least estimated TTFT among its first
        candidates under the load bound; None when the pool has no active endpoint."""
        found = candidates(view, hash_value, loads, load_factor,
                           prefer_kv_pool=prefer_kv_pool, exclude=exclude)
        if not self.config.enabled:
            return next(found, None)
        best: str | None = None
        best_s = float("inf")
        for address in islice(found, self.config.candidates):
            # Re-placed within its KV pool, the session's context is read from DDR there.
            ddr = (size.context_tokens if prefer_kv_pool is not None
                   and view.kv_pool_of(address) == prefer_kv_pool else 0)
            seconds = self.estimate(address, now, size, ddr_tokens=ddr)
            if seconds < best_s:
                best, best_s = address, seconds
        return best

    def reconsider(
        self, view: PoolView, current: str, hash_value: int, loads: Mapping[str, int],
        load_factor: float, now: float, size: PromptSize, moved_at: float | None = None,
    ) -> Move | None:
        """Whether a session bound to `current` (active) should move to a DDR-pool sibling."""
        config = self.config
        if not config.enabled or (moved_at is not None and now - moved_at < config.cooldown_s):
            return None
        # Moving saves at most the current engine's backlog (the prefill is the same anywhere):
        # under the threshold there is nothing to look at, which keeps sticky requests O(1).
        backlog = self.board.backlog_s(current, now)
        if backlog < config.min_saving_s:
            return None
        kv_pool = view.kv_pool_of(current)
        same_kv = view.ring_for(kv_pool, current) if kv_pool is not None else None
        whole = view.ring_for(None, None)
        if same_kv is None or whole is None or same_kv is whole:
            return None  # no sibling shares its DDR pool
        bound = LoadBound(view, whole, loads, load_factor, extra=0)
        stay = self.cost.ttft_s(backlog, size.prompt_tokens, hbm_tokens=size.context_tokens)
        best: str | None = None
        best_s = float("inf")
        siblings = (a for a in same_kv.ring.walk(hash_value) if a != current and bound.admits(a))
        for address in islice(siblings, config.candidates):
            seconds = self.estimate(address, now, size, ddr_tokens=size.context_tokens)
            if seconds < best_s:
                best, best_s = address, seconds
        if best is None:
            return None
        saving = stay - best_s
        if saving < config.min_saving_s or saving < config.min_saving_ratio * stay:
            return None
        if config.miss_safe and self.estimate(best, now, size) > stay:
            # The pool may have lost the context (evicted, down, restarted): then the sibling
            # prefills it all. Only a move that is no worse even so is taken.
            return None
        return Move(best, stay, best_s)
