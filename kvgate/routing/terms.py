"""The score: a request's estimated time to first token on one endpoint, in seconds, as a sum of
terms. Adding a signal is one class here (or in its own module) with `seconds()`, listed in
`default_terms`, reading its setting from its config key.

A term either overlaps the wait in the engine's queue (`overlaps_wait`: a DDR read runs while
the request waits, vLLM's asynchronous KV connectors) or follows it (the prefill). The estimate
is the longest of the overlapping terms plus each following term: for the three terms below,
exactly `max(queue, ddr read) + prefill`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate.placement.cost import EngineCost
from kvgate.placement.gate import GateConfig


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint for one request, as the terms price it."""

    address: str
    backlog_s: float  # prefill queued ahead of the request there (the load board's)
    prompt_tokens: int  # the request's prompt (an estimate; 0: unknown)
    hbm_tokens: int = 0  # of it already in the endpoint's HBM (a session that stays)
    ddr_tokens: int = 0  # of it read from the DDR pool first (a session moved within its pool)


class Term(Protocol):
    """One part of the estimate."""

    @property
    def overlaps_wait(self) -> bool:
        """True: it runs during the queue wait (the longest such term counts), else after."""
        ...

    def seconds(self, candidate: Candidate) -> float:
        """This term's share of the candidate's estimated TTFT, in seconds."""
        ...


@dataclass(frozen=True, slots=True)
class QueueWait:
    """The prefill work queued ahead of the request."""

    overlaps_wait: bool = True

    def seconds(self, candidate: Candidate) -> float:
        return candidate.backlog_s


@dataclass(frozen=True, slots=True)
class DdrRead:
    """Reading the session's context from the DDR pool (`placement.engine_cost`: ddr_gbps,
    kv_bytes_per_token, transfer_fixed_ms)."""

    cost: EngineCost
    overlaps_wait: bool = True

    def seconds(self, candidate: Candidate) -> float:
        return self.cost.transfer_s(candidate.ddr_tokens)


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prefilling what neither tier holds (`placement.engine_cost`: prefill_tokens_per_s,
    prefill_overhead_s), and the whole prompt's per-token cost (prompt_us_per_token)."""

    cost: EngineCost
    overlaps_wait: bool = False

    def seconds(self, candidate: Candidate) -> float:
        c = candidate
        uncached = c.prompt_tokens - c.hbm_tokens - c.ddr_tokens
        return self.cost.prefill_s(uncached, c.prompt_tokens)


def default_terms(cost: EngineCost, gate: GateConfig) -> tuple[Term, ...]:
    """The gate's terms, from the two config sections a term may read (`placement.engine_cost`,
    `placement.load_gate`). A new signal is appended here."""
    del gate  # no term reads the gate's section yet
    return (QueueWait(), DdrRead(cost), Prefill(cost))


class Estimate:
    """Estimated TTFT from terms: the longest overlapping term, then each following one."""

    __slots__ = ("_after", "_during")

    def __init__(self, terms: Sequence[Term]) -> None:
        self._during = tuple(t for t in terms if t.overlaps_wait)
        self._after = tuple(t for t in terms if not t.overlaps_wait)

    def seconds(self, candidate: Candidate) -> float:
        # The same operations, in the same order, as EngineCost's `max(wait, read) + prefill`,
        # so the figures a simulation committed reproduce to the last digit.
        wait = 0.0
        for index, term in enumerate(self._during):
            value = term.seconds(candidate)
            wait = value if index == 0 else max(wait, value)
        for term in self._after:
            wait = wait + term.seconds(candidate)
        return wait
