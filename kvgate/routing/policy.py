"""What the pipeline asks of a routing policy, and the static one (stickiness on the ring with
bounded load: no clock, no size, nothing booked).

A policy answers four questions: what it knows of a request (`known`), whether a session bound
to an active or draining endpoint should move (`reconsider`), where a new or re-placed session
goes (`place`), and whether it routes a request with no session itself (`sessionless`). Its
booking hooks (`hooks`) run once a request with a session is routed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from kvgate.bindings.model import MoveEstimate
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.placement.pick import place
from kvgate.placement.signals import HbmResidency
from kvgate.placement.view import PoolView
from kvgate.routing.recent import Seen


@dataclass(frozen=True, slots=True)
class PromptSize:
    """What the router can tell of a request before it is sent (token estimates; 0 unknown)."""

    prompt_tokens: int = 0  # this request's prompt
    context_tokens: int = 0  # what its session's engine already holds of it (its last prompt)


class Known(NamedTuple):
    """What a policy knows of one request when it decides: the instant on its clock, the
    prompt's estimated size, and what it remembers of the session. (A tuple: it is made for
    every request, sticky ones included, and a tuple is the cheapest record to make.)"""

    now: float = 0.0
    prompt_tokens: int = 0  # 0: unknown
    seen: Seen | None = None
    session: str = ""
    blocks: Sequence[int] = ()  # the prompt's chained block hashes, where known (else empty)

    @property
    def size(self) -> PromptSize:
        """The prompt, and what its session's engine holds of it (its last prompt)."""
        return PromptSize(self.prompt_tokens, 0 if self.seen is None else self.seen.tokens)


NOTHING_KNOWN = Known()

__all__ = ["NOTHING_KNOWN", "STATIC", "BookingHook", "HbmResidency", "Known", "Moved", "Placing",
           "Policy", "PoolResidency", "PromptSize", "StaticPolicy"]


class PoolResidency(Protocol):
    """How much of a session's context its DDR pool still holds, where that can be known (the
    simulator's own pool today; a pool's event stream later)."""

    def pool_tokens(self, kv_pool: str, session: str, context_tokens: int) -> int | None:
        """Leading tokens of the session's context the pool would serve a sibling now, at most
        ``context_tokens``; None when not known (the gate then assumes it all, miss-safe)."""
        ...


class Moved(NamedTuple):
    """A bound session the policy moves: where, why, and what it estimated (the load gate)."""

    endpoint: str
    reason: MoveReason
    estimate: MoveEstimate | None = None


class Placing(NamedTuple):
    """Where a session is being placed: its pool's view, ring hash and session counts."""

    view: PoolView
    hash_value: int
    loads: Mapping[str, int]
    load_factor: float


class BookingHook(Protocol):
    """Runs once a request is routed (after its binding is committed, or kept)."""

    def kept(self, pool: str, session: str, endpoint: str, known: Known) -> None:
        """The request stays with its session's engine (no binding written)."""
        ...

    def routed(self, pool: str, session: str, view: PoolView, endpoint: str,
               previous: str | None, known: Known, *, moved: bool) -> None:
        """The request was placed on `endpoint` (`previous`: its session's endpoint before;
        `moved`: the policy or a failure moved it)."""
        ...


class Policy(Protocol):
    """How sessions are placed and kept; the pipeline does the rest."""

    hooks: tuple[BookingHook, ...]
    # It places new sessions and moves for load with the prompt's leading blocks (`Known.blocks`).
    reads_prompts: bool

    def known(self, pool: str, session: str, prompt_tokens: int) -> Known:
        """What this policy needs of the request; `prompt_tokens` 0 when unknown."""
        ...

    def reconsider(self, placing: Placing, endpoint: str, state: EndpointState,
                   known: Known) -> Moved | None:
        """Where a session bound to `endpoint` (active or draining) should move and why, or
        None."""
        ...

    def place(self, placing: Placing, known: Known, *, prefer_kv_pool: str | None,
              exclude: str | None) -> str | None:
        """A new (or re-placed) session's endpoint; None when the pool has no active one."""
        ...

    def sessionless(self, view: PoolView, prompt_tokens: int) -> str | None:
        """Where a request with no session goes, booked there (its load counts like any
        other's); None: Envoy's own balancing picks and nothing is booked."""
        ...

    def forget(self, address: str) -> None:
        """An endpoint failed or left: what the policy knew of its load no longer holds."""
        ...


class StaticPolicy:
    """Static stickiness: a bound session stays; placement is the ring's first endpoint under
    the load bound (its KV pool first)."""

    hooks: tuple[BookingHook, ...] = ()
    reads_prompts = False

    def known(self, pool: str, session: str, prompt_tokens: int) -> Known:
        return NOTHING_KNOWN  # nothing read, nothing allocated on the sticky path

    def reconsider(self, placing: Placing, endpoint: str, state: EndpointState,
                   known: Known) -> Moved | None:
        return None

    def place(self, placing: Placing, known: Known, *, prefer_kv_pool: str | None,
              exclude: str | None) -> str | None:
        return place(placing.view, placing.hash_value, placing.loads, placing.load_factor,
                     prefer_kv_pool=prefer_kv_pool, exclude=exclude)

    def sessionless(self, view: PoolView, prompt_tokens: int) -> str | None:
        return None

    def forget(self, address: str) -> None:
        pass


STATIC = StaticPolicy()
