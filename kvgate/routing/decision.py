"""What the pipeline answers for one request, and the failures it reports."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvgate.contract.states import MoveReason


class Outcome(StrEnum):
    STICKY = "sticky"
    NEW = "new"
    REBIND = "rebind"
    SESSIONLESS = "sessionless"
    UNBOUND = "unbound"  # no binding made (queue full, binding cap): Envoy's ring places it
    ERROR = "error"
    # Envoy cancelled the stream before the decision was made (its message timeout, or the
    # client left); Envoy routed the request on its ring. Only the gRPC transport can tell.
    ABANDONED = "abandoned"


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
    # Not decided yet: the decision would weigh the prompt's leading blocks (the prefix step),
    # which the caller said it can read; asked again with them (Pipeline.decide's `prompt`).
    wants_prompt: bool = False


SESSIONLESS = Decision(Outcome.SESSIONLESS)
PROMPT_WANTED = Decision(Outcome.NEW, wants_prompt=True)
