"""Live load: how much prefill work is queued on each engine, as the router knows it.

Two sources, each with its instant, so staleness is explicit:
- the ledger: what this router sent and has not seen finish its prefill, as estimated seconds
  of work (it is exact about what it sent, blind to what other routers send);
- observations: what an engine reports (its gauges, kvgate.contract.vllm.GAUGES), refreshed
  every so often; older than `max_age_s` they count for nothing.
The backlog of an engine is the larger of the two, each aged by the time since it was known; or,
with `from_reports`, a fresh report aged plus what the ledger booked after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvgate.contract.vllm import GAUGE_INDEX, GAUGES, EngineFigures
from kvgate.placement.since_report import BookedSince

NO_FIGURES = EngineFigures()  # every gauge 0 (a report that gives only a backlog)


@dataclass(frozen=True, slots=True)
class ObservedLoad:
    """One engine's load as observed at `at` (the router's clock, seconds)."""

    at: float
    backlog_s: float = 0.0  # prefill work queued ahead of a new request, as of `at`
    figures: EngineFigures = NO_FIGURES  # its gauges (kvgate.contract.vllm.GAUGES)

    def backlog_at(self, now: float) -> float:
        """The backlog left at `now` if the engine kept prefilling and nothing new arrived."""
        return max(0.0, self.backlog_s - max(0.0, now - self.at))


class ObservedRound:
    """Every engine's report from one collector round, kept as it arrived (columns, one per
    gauge of kvgate.contract.vllm.GAUGES, entry i for `endpoints[i]`) and made into an
    `ObservedLoad` only when a decision asks for that engine: a replica takes a round of a
    thousand engines without building a thousand objects, most of which no decision reads
    before the next round replaces them. Its figures never change once it is made; `drop` only
    hides an engine that left."""

    __slots__ = (
        "_ages",
        "_columns",
        "_made",
        "_mean_s",
        "_now",
        "_waiting",
        "index",
    )

    def __init__(self, index: Mapping[str, int], now: float, ages: Sequence[float],
                 columns: Sequence[Sequence[float]], mean_prefill_s: float) -> None:
        """`index`: endpoint → its entry; `now`: when the round arrived (the router's clock),
        each figure read `ages[i]` before; a waiting request is `mean_prefill_s` of backlog,
        as a scrape prices it (kvgate.routing.engine_load.observed_load)."""
        if len(columns) != len(GAUGES):
            raise ValueError(f"a round has {len(GAUGES)} gauge columns, got {len(columns)}")
        self.index = index  # shared by the rounds of one set of engines
        self._now = now
        self._ages = ages
        self._columns = columns
        self._waiting = columns[GAUGE_INDEX["waiting"]]
        self._mean_s = mean_prefill_s
        self._made: dict[str, ObservedLoad | None] = {}

    def get(self, address: str) -> ObservedLoad | None:
        made = self._made.get(address, _UNMADE)
        if made is not _UNMADE:
            return made
        i = self.index.get(address)
        load = None if i is None else ObservedLoad(
            self._now - self._ages[i], self._waiting[i] * self._mean_s,
            EngineFigures([column[i] for column in self._columns]))
        self._made[address] = load
        return load

    def drop(self, address: str) -> None:
        """Forget `address`'s report in this round (the engine left)."""
        self._made[address] = None


_UNMADE = ObservedLoad(float("nan"))  # ObservedRound: not made yet (compared by identity)


class LoadBoard:
    """Per engine, the ledger of work this router sent and the latest observation.

    Pure bookkeeping on a caller's clock: no I/O, no timers. Memory is one entry per engine."""

    def __init__(self, max_age_s: float = 2.0) -> None:
        self.max_age_s = max_age_s
        self._busy_until: dict[str, float] = {}  # when the work this router sent is prefilled
        # `from_reports`: a fresh report plus what was booked since it, not max(ledger, report)
        # (placement.load_gate.board_from_reports); per engine, what was booked lately.
        self.from_reports = False
        self._since: dict[str, BookedSince] = {}
        self._observed: dict[str, ObservedLoad] = {}
        self._round: ObservedRound | None = None  # the collector's latest, where it feeds us

    def routed(self, address: str, now: float, prefill_s: float, ready_at: float | None = None,
               ) -> None:
        """A request was sent to `address` at `now`, with `prefill_s` of work that can start once
        its context is loaded (`ready_at`, default now)."""
        start = max(self._busy_until.get(address, now), ready_at if ready_at is not None else now)
        self._busy_until[address] = start + prefill_s
        if self.from_reports:
            since = self._since.get(address)
            if since is None:
                since = self._since[address] = BookedSince()
            # Kept one report age beyond any fresh report: what was booked just before it.
            since.book(now, prefill_s, 2 * self.max_age_s)

    def observe(self, address: str, load: ObservedLoad) -> None:
        """An engine's own report (a scrape), replacing the previous one."""
        self._observed[address] = load

    def observe_round(self, round_: ObservedRound) -> None:
        """A collector round, replacing the previous one (reports it lacks age out as before:
        an engine it no longer covers keeps its last report until `max_age_s`)."""
        previous, self._round = self._round, round_
        if previous is not None and previous.index is not round_.index:
            for address in previous.index.keys() - round_.index.keys():
                load = previous.get(address)
                if load is not None:
                    self._observed[address] = load

    def observed(self, address: str, now: float) -> ObservedLoad | None:
        """The engine's latest report, if it is no older than `max_age_s`."""
        load = self._observed.get(address)
        round_ = self._round
        if round_ is not None:
            in_round = round_.get(address)
            if in_round is not None and (load is None or in_round.at >= load.at):
                load = in_round
        if load is None or now - load.at > self.max_age_s:
            return None
        return load

    def backlog_s(self, address: str, now: float) -> float:
        """Seconds of prefill queued ahead of a request sent to `address` now."""
        ledger = max(0.0, self._busy_until.get(address, now) - now)
        seen = self.observed(address, now)
        if seen is None:
            return ledger
        if self.from_reports:
            return self._from_report(address, now, seen, ledger)
        return max(ledger, seen.backlog_at(now))

    def _from_report(self, address: str, now: float, seen: ObservedLoad, ledger: float
                     ) -> float:
        """`from_reports`: the report aged plus what was booked after it. Its waiting count
        misses a request already in prefill (vLLM counts it running), which the ledger
        knows: the ledger is kept up to the largest prefill booked before the report, aged.
        Without that cap the ledger's drift ranks engines at the peak; with no ledger at all
        bank-coding 1x and 3x lose 18 % and 34 % at p99 (docs/journal/load-gate.md).
        O(1) amortized (kvgate.placement.since_report)."""
        since = self._since.get(address)
        if since is None:  # nothing booked there lately: the report alone
            return seen.backlog_at(now)
        # Its waiting requests priced first come, first served (vLLM's waiting queue;
        # kvgate.placement.since_report): the newest that many this router booked there before
        # the report. Live, a replica knows only its own bookings: any more (another
        # replica's, or booked before the kept window) at the report's mean. Against the mean
        # for all of them, TTFT p99 with the setting on: Mooncake trace at 8 engines 17.69 ->
        # 16.93 s, agentic-coding 1,440 4.61 -> 4.33 s, but bank-coding 12,800 with the
        # mooncake connector 15.10 -> 16.40 s (docs/journal/load-gate.md, 2026-12-08).
        backlog, after, before = since.report(seen.at, seen.backlog_s, seen.figures.waiting)
        age = now - seen.at
        if age > 0.0:  # aged since the report (the max() calls written out: the sticky path)
            backlog -= age
            before -= age
        report = (backlog if backlog > 0.0 else 0.0) + after
        most = report + (before if before > 0.0 else 0.0)
        capped = ledger if ledger <= most else most
        return report if report >= capped else capped

    def forget(self, address: str) -> None:
        """An engine left the pool (or failed: its queue is gone)."""
        self._busy_until.pop(address, None)
        self._since.pop(address, None)
        self._observed.pop(address, None)
        if self._round is not None:
            self._round.drop(address)
