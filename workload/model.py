"""What a workload is: requests in arrival order, each a prefix of a chain of segments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Segment(NamedTuple):
    """A run of ``tokens`` tokens whose content is a deterministic function of ``key``.

    Two segments with the same key are the same text (a shorter one is a prefix of a longer one),
    segments with different keys share nothing.
    """

    key: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Request:
    """One request: its prompt is ``chain[:length]``; consecutive turns of a session share
    ``chain`` (turn t+1's prompt extends turn t's), which lets hashing be incremental."""

    arrival: float  # emulated seconds from the workload's start (see think_s)
    session: str  # the session header's value
    chain: Sequence[Segment]
    length: int
    max_tokens: int
    # Set on a later turn of a session: it is sent this long after the previous turn's answer
    # has finished (closed loop: the prompt contains that answer). ``arrival`` is then the time
    # it would come if every earlier answer were instant; None: sent at ``arrival`` (open loop).
    think_s: float | None = None

    @property
    def segments(self) -> Sequence[Segment]:
        return self.chain[: self.length]

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)


@dataclass(slots=True)
class Workload:
    """Requests sorted by arrival, a description (for the JSON output), and the warm-up cut."""

    name: str
    requests: list[Request]
    describe: dict[str, Any] = field(default_factory=dict)
    warmup_s: float = 0.0  # requests arriving earlier are sent but excluded from the figures
    _next_turns: list[int] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival if self.requests else 0.0

    def measured(self, request: Request) -> bool:
        """By the nominal arrival, so that every routing mode measures the same requests."""
        return request.arrival >= self.warmup_s

    def next_turns(self) -> list[int]:
        """Index of the turn sent after each request's answer (closed loop), or -1. Worked out
        once (the requests do not change once built); do not modify the list."""
        if self._next_turns is None or len(self._next_turns) != len(self.requests):
            self._next_turns = self._find_next_turns()
        return self._next_turns

    def _find_next_turns(self) -> list[int]:
        following = [-1] * len(self.requests)
        previous: dict[int, int] = {}
        for i, request in enumerate(self.requests):
            chain = id(request.chain)
            if request.think_s is not None and chain in previous:
                following[previous[chain]] = i
            previous[chain] = i
        return following
