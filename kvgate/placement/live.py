"""Live load: how much prefill work is queued on each engine, as the router knows it.

Two sources, each with its instant, so staleness is explicit:
- the ledger: what this router sent and has not seen finish its prefill, as estimated seconds
  of work (it is exact about what it sent, blind to what other routers send);
- observations: what an engine reports (`vllm:num_requests_waiting`, `_running`,
  `kv_cache_usage_perc`), refreshed every so often; older than `max_age_s` they count for nothing.
The backlog of an engine is the larger of the two, each aged by the time since it was known.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ObservedLoad:
    """One engine's load as observed at `at` (the router's clock, seconds)."""

    at: float
    backlog_s: float = 0.0  # prefill work queued ahead of a new request, as of `at`
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # 0..1

    def backlog_at(self, now: float) -> float:
        """The backlog left at `now` if the engine kept prefilling and nothing new arrived."""
        return max(0.0, self.backlog_s - max(0.0, now - self.at))


class LoadBoard:
    """Per engine, the ledger of work this router sent and the latest observation.

    Pure bookkeeping on a caller's clock: no I/O, no timers. Memory is one entry per engine."""

    def __init__(self, max_age_s: float = 2.0) -> None:
        self.max_age_s = max_age_s
        self._busy_until: dict[str, float] = {}  # when the work this router sent is prefilled
        self._observed: dict[str, ObservedLoad] = {}

    def routed(self, address: str, now: float, prefill_s: float, ready_at: float | None = None,
               ) -> None:
        """A request was sent to `address` at `now`, with `prefill_s` of work that can start once
        its context is loaded (`ready_at`, default now)."""
        start = max(self._busy_until.get(address, now), ready_at if ready_at is not None else now)
        self._busy_until[address] = start + prefill_s

    def observe(self, address: str, load: ObservedLoad) -> None:
        """An engine's own report (a scrape), replacing the previous one."""
        self._observed[address] = load

    def observed(self, address: str, now: float) -> ObservedLoad | None:
        """The engine's latest report, if it is no older than `max_age_s`."""
        load = self._observed.get(address)
        if load is None or now - load.at > self.max_age_s:
            return None
        return load

    def backlog_s(self, address: str, now: float) -> float:
        """Seconds of prefill queued ahead of a request sent to `address` now."""
        ledger = max(0.0, self._busy_until.get(address, now) - now)
        seen = self.observed(address, now)
        return ledger if seen is None else max(ledger, seen.backlog_at(now))

    def forget(self, address: str) -> None:
        """An engine left the pool (or failed: its queue is gone)."""
        self._busy_until.pop(address, None)
        self._observed.pop(address, None)
