"""The score: a request's estimated time to first token on one endpoint, in seconds, as a sum of
named terms. A term is a class here with a `name`, listed in `TERMS`; it prices a `Candidate`
from the engine's signals (`candidate.engine`, kvgate.placement.signals: backlog, reported
gauges, HBM residency) and the engines' speed (`placement.engine_cost`). The terms in use are
`placement.load_gate.terms` (default `DEFAULT_TERMS`).

A term either overlaps the wait in the engine's queue (`overlaps_wait`: a DDR read runs while
the request waits, vLLM's asynchronous KV connectors) or follows it (the prefill). The estimate
is the longest of the overlapping terms plus each following term: for the default terms,
exactly `max(queue, ddr read) + prefill`. The `*_after_wait` read terms follow the wait
instead, as vLLM's scheduler orders a read (`Scheduler.schedule` starts a request's connector
load only when it reaches the request; docs/journal/small-fleet.md): `queue + read + prefill`.
Where the connector loads in the step (`engine_cost.pool_load: in_step`), `ddr_read` and
`link_backlog` follow the wait too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvgate.placement.cost import POOL_LOAD_IN_STEP, EngineCost
from kvgate.placement.signals import EngineSignals


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint for one request, as the terms price it."""

    engine: EngineSignals  # the endpoint's signals at the decision's instant
    prompt_tokens: int  # the request's prompt (an estimate; 0: unknown)
    hbm_tokens: int = 0  # of it already in the endpoint's HBM (a session that stays)
    ddr_tokens: int = 0  # of it read from the DDR pool first (a session moved within its pool)

    @property
    def address(self) -> str:
        return self.engine.address


class Term:
    """One named part of the estimate, made from the engines' speed."""

    name: ClassVar[str]  # its name in `placement.load_gate.terms`
    # True: it runs during the queue wait (the longest such term counts); False: after it.
    overlaps_wait: ClassVar[bool]

    __slots__ = ("cost",)

    def __init__(self, cost: EngineCost) -> None:
        self.cost = cost

    def seconds(self, candidate: Candidate) -> float:
        """This term's share of the candidate's estimated TTFT, in seconds."""
        raise NotImplementedError


class QueueWait(Term):
    """The prefill work queued ahead of the request (the engine's backlog)."""

    name = "queue_wait"
    overlaps_wait = True
    __slots__ = ()

    def seconds(self, candidate: Candidate) -> float:
        return candidate.engine.backlog_s


class DdrRead(Term):
    """Reading the session's context from the DDR pool (`placement.engine_cost`: ddr_gbps,
    kv_bytes_per_token, transfer_fixed_ms)."""

    name = "ddr_read"
    overlaps_wait = True
    __slots__ = ()

    def seconds(self, candidate: Candidate) -> float:
        return self.cost.transfer_s(candidate.ddr_tokens)


class QueuedDdrRead(Term):
    """Reading the context from the DDR pool sharing the engine's device link and its node's
    with the reads booked on them, as the links share (`EngineSignals.ddr_read_s`,
    kvgate.placement.links: processor sharing on each link): the `ddr_read` term with its
    links' backlog; exactly `ddr_read` where nothing is booked."""

    name = "link_backlog"
    overlaps_wait = True
    __slots__ = ()

    def seconds(self, candidate: Candidate) -> float:
        read = candidate.engine.ddr_read_s(candidate.ddr_tokens)
        return self.cost.transfer_s(candidate.ddr_tokens) if read is None else read


class DdrReadAfterWait(DdrRead):
    """`ddr_read` started once the queue ahead has gone (vLLM's order): added to the wait."""

    name = "ddr_read_after_wait"
    overlaps_wait = False
    __slots__ = ()


class QueuedDdrReadAfterWait(QueuedDdrRead):
    """`link_backlog` started once the queue ahead has gone (vLLM's order): added to the wait."""

    name = "link_backlog_after_wait"
    overlaps_wait = False
    __slots__ = ()


class Prefill(Term):
    """Prefilling what neither tier holds (`placement.engine_cost`: prefill_tokens_per_s,
    prefill_overhead_s), and the whole prompt's per-token cost (prompt_us_per_token)."""

    name = "prefill"
    overlaps_wait = False
    __slots__ = ()

    def seconds(self, candidate: Candidate) -> float:
        c = candidate
        uncached = c.prompt_tokens - c.hbm_tokens - c.ddr_tokens
        return self.cost.prefill_s(uncached, c.prompt_tokens)


# Every term by name: a new one is a class above (or imported here) and its entry.
TERMS: Mapping[str, type[Term]] = {t.name: t for t in (
    QueueWait, DdrRead, QueuedDdrRead, DdrReadAfterWait, QueuedDdrReadAfterWait, Prefill)}
DEFAULT_TERMS = ("queue_wait", "ddr_read", "prefill")


# Where the engines' connector loads in the step (`engine_cost.pool_load: in_step`), the read
# holds the engine once it reaches the request: it follows the wait whichever term names it.
_IN_STEP = {DdrRead.name: DdrReadAfterWait, QueuedDdrRead.name: QueuedDdrReadAfterWait}


def make_terms(names: Iterable[str], cost: EngineCost) -> tuple[Term, ...]:
    """The terms `names` lists (`placement.load_gate.terms`), in that order."""
    unknown = [name for name in names if name not in TERMS]
    if unknown:
        raise ValueError(f"unknown scoring terms: {', '.join(unknown)} "
                         f"(known: {', '.join(TERMS)})")
    in_step = cost.pool_load == POOL_LOAD_IN_STEP
    return tuple((_IN_STEP.get(name, TERMS[name]) if in_step else TERMS[name])(cost)
                 for name in names)


class Estimate:
    """Estimated TTFT from terms: the longest overlapping term, then each following one."""

    __slots__ = ("_after", "_during", "terms")

    def __init__(self, terms: Sequence[Term]) -> None:
        self.terms = tuple(terms)
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

    def parts(self, candidate: Candidate) -> dict[str, float]:
        """Each term's seconds for `candidate` (rounded to the µs), by name: what a decision's
        debug line shows."""
        return {term.name: round(term.seconds(candidate), 6) for term in self.terms}
