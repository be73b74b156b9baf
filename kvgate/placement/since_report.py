"""`board_from_reports`' bookkeeping for one engine: what this router booked there lately, split
at the instant of the engine's latest report, kept so that a read costs O(1) (amortized).

`LoadBoard._from_report` needs, for the report it reads, the seconds booked after the report
and the largest prefill booked before it, over the bookings of the last 2 x `max_age_s`. Walking
them on each read cost ~200 us a sticky decision at the bench's rate (docs/journal/load-gate.md,
"board_from_reports across the sweep"). Here both are kept as each booking arrives and moved
once when the report changes (reports come every `refresh_s`; decisions far more often): the
seconds after the report as a running sum, the largest before it as a sliding-window maximum.

It also prices a report's waiting requests as the newest that many bookings made at or before
the report (`waiting_s`): vLLM's waiting queue is first come, first served (the default
`SchedulerConfig.policy = "fcfs"`, vllm/config/scheduler.py; the scheduler's `self.waiting =
create_request_queue(self.policy)`, vllm/v1/core/sched/scheduler.py; `FCFSRequestQueue` appends
and pops from the left, vllm/v1/core/sched/request_queue.py), so what still waits is what came
last. Live, a replica knows only its own bookings: with several replicas, or with requests
booked before the kept window, the rest are priced at the report's mean (the caller's part).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

KEPT_BEFORE = 64  # bookings kept before the window for `waiting_s` (a waiting queue's length)


class BookedSince:
    """One engine's bookings (when, seconds), in the order they were booked, and, for the
    report instant last asked (`split`), the sum of the seconds booked after it and the largest
    booked at or before it.

    Bookings come in time order on one clock; one that does not (a booking older than the one
    before it) makes the bookings not splittable at one index, and reads walk them all (as the
    straightforward rule does) until it has left the window (and, for `waiting_s`, the
    bookings kept before it)."""

    __slots__ = ("_after_s", "_at", "_disorder", "_head", "_peaks", "_seconds", "_split",
                 "_split_at", "_waiting", "_waiting_first", "_waiting_for")

    def __init__(self) -> None:
        self._at: list[float] = []  # when each booking was made, entries _head.. are live
        self._seconds: list[float] = []
        self._head = 0  # the oldest live booking's index (older ones left the window)
        self._split_at: float | None = None  # the report instant the split is for
        self._split = 0  # index of the first booking after `_split_at`
        self._after_s = 0.0  # the seconds booked after it, summed in booking order
        # (index, seconds) of the bookings in [_head, _split), seconds strictly decreasing:
        # the first is the largest (a sliding-window maximum).
        self._peaks: deque[tuple[int, float]] = deque()
        self._disorder = -1  # the newest booking older than the one before it (-1: none)
        # `waiting_s`' last answer and what it was for (report instant, count); None: moved.
        self._waiting_for: tuple[float, int] | None = None
        self._waiting = (0.0, 0)
        self._waiting_first = 0  # the oldest booking it counted

    def book(self, now: float, seconds: float, horizon_s: float) -> None:
        """`seconds` booked at `now`; bookings more than `horizon_s` older than `now` leave."""
        at = self._at
        index = len(at)
        if index and now < at[-1]:
            self._disorder, self._split_at = index, None  # split again once it has left
        at.append(now)
        self._seconds.append(seconds)
        split_at = self._split_at
        if split_at is not None:
            if now > split_at:
                self._after_s += seconds
            elif self._split == index:  # in time order: every earlier one is before too
                self._split = index + 1
                self._push(index, seconds)
                self._waiting_for = None
            # else out of order (an earlier booking is after the report): walked on read
        if now - at[self._head] > horizon_s:
            self._drop_older(now, horizon_s)

    def _push(self, index: int, seconds: float) -> None:
        peaks = self._peaks
        while peaks and peaks[-1][1] <= seconds:
            peaks.pop()
        peaks.append((index, seconds))

    def _drop_older(self, now: float, horizon_s: float) -> None:
        """Bookings more than `horizon_s` before `now` leave (from the front, as booked; the
        oldest does)."""
        at, head = self._at, self._head
        while head < len(at) and now - at[head] > horizon_s:
            head += 1
        self._head = head
        if head - KEPT_BEFORE > self._waiting_first:  # it counted one no longer kept
            self._waiting_for = None
        peaks = self._peaks
        while peaks and peaks[0][0] < head:
            peaks.popleft()
        if self._split < head:  # a booking after the report left: sum the rest again
            self._split_at = None
        cut = head - KEPT_BEFORE
        if cut > 64 and 2 * cut > len(at):  # compact: memory stays one window and a queue
            del at[:cut], self._seconds[:cut]
            self._peaks = deque((i - cut, s) for i, s in peaks)
            self._split -= cut
            self._disorder -= cut
            self._waiting_first -= cut
            self._head -= cut

    def split(self, report_at: float) -> tuple[float, float]:
        """(seconds booked after `report_at`, summed in booking order; the largest booked at
        or before it, at least 0)."""
        _, after, before = self.report(report_at, 0.0, 0)
        return after, before

    def report(self, report_at: float, backlog_s: float, waiting: int
               ) -> tuple[float, float, float]:
        """For a report made at `report_at` of `waiting` requests priced `backlog_s` in all:
        (its backlog with the waiting ones priced first come, first served, `waiting_s`, and
        any more at the report's mean; `split`'s two). One call on the sticky path."""
        if self._disorder >= self._head:
            after, before = self._walk(report_at)
        else:
            if self._split_at != report_at:
                self._move(report_at)
            after, peaks = self._after_s, self._peaks
            before = peaks[0][1] if peaks and peaks[0][1] > 0.0 else 0.0
        if waiting <= 0:  # nothing waits (or a report that gives only seconds)
            return backlog_s, after, before
        booked, found = self.waiting_s(report_at, waiting)
        if found < waiting:
            booked += (waiting - found) * (backlog_s / waiting)
        return booked, after, before

    def _move(self, report_at: float) -> None:
        """The split for a new report: forward from the last one's (the usual case: reports
        go forward), else from the oldest booking; the seconds after it summed again."""
        at, seconds = self._at, self._seconds
        last = self._split_at
        if last is None or report_at < last:
            self._split, self._peaks = self._head, deque()
        index = self._split
        while index < len(at) and at[index] <= report_at:
            self._push(index, seconds[index])
            index += 1
        self._split, self._split_at, self._waiting_for = index, report_at, None
        after = 0.0
        for i in range(index, len(at)):
            after += seconds[i]
        self._after_s = after

    def _walk(self, report_at: float) -> tuple[float, float]:
        """`split` over every live booking, for bookings not in time order."""
        after = before = 0.0
        at, seconds = self._at, self._seconds
        for i in range(self._head, len(at)):
            if at[i] > report_at:
                after += seconds[i]
            elif seconds[i] > before:
                before = seconds[i]
        return after, before

    def waiting_s(self, report_at: float, count: int) -> tuple[float, int]:
        """(the seconds of the newest `count` bookings made at or before `report_at`, how many
        there were): a report's waiting requests, first come, first served. Among the bookings
        of the window and the `KEPT_BEFORE` before it; fewer when fewer were booked there.
        Computed once per report (and count), then kept until a booking or the window moves."""
        lowest = max(0, self._head - KEPT_BEFORE)
        if self._disorder > lowest:  # not in time order where it looks
            return self._walk_waiting(report_at, count)
        if self._waiting_for == (report_at, count):
            return self._waiting
        if self._split_at != report_at:
            self._move(report_at)
        at, seconds = self._at, self._seconds
        end = (self._split if self._split > self._head
               else bisect_right(at, report_at, lowest, self._head))
        first = max(lowest, end - count)
        total = 0.0
        for i in range(first, end):
            total += seconds[i]
        self._waiting_for, self._waiting = (report_at, count), (total, end - first)
        # Clipped at the oldest kept: a booking leaving the kept ones changes it.
        self._waiting_first = first if first > end - count else first - 1
        return self._waiting

    def _walk_waiting(self, report_at: float, count: int) -> tuple[float, int]:
        """`waiting_s` for bookings not in time order: the newest `count` booked (in booking
        order) at or before `report_at`."""
        at, seconds = self._at, self._seconds
        found = [seconds[i] for i in range(max(0, self._head - KEPT_BEFORE), len(at))
                 if at[i] <= report_at][-count:] if count > 0 else []
        total = 0.0
        for one in found:
            total += one
        return total, len(found)
