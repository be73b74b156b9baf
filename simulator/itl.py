"""Inter-token latency of one engine, from the steps its prefills and decodes share.

vLLM v1 runs one step at a time and puts the running requests' decode tokens and a waiting
request's prefill chunk in the same step, up to ``max_num_batched_tokens``
(``v1/core/sched/scheduler.py`` ``Scheduler.schedule``; the facts and their sources are in
``emulator.steps``). A decoding request therefore gets one token per step, and a step carrying
a prefill chunk lasts ``step_s + budget x token_s``: that is the interference a colocated engine
puts into its streams, and what a decode engine freed of prefills no longer sees.

How the figures are made, without changing any TTFT (this is accounting beside the schedule):

- The engine's prefill intervals are the ones its TTFTs come from: each admitted request's
  ``[prefill_start, first_token]`` from the timing model in use (the default ``fcfs`` serial
  prefill stage, or ``vllm-steps``), merged where they overlap, with the tokens they compute.
- An interval computing ``c`` tokens is ``k = ceil(c / budget)`` steps: ``k - 1`` full ones
  (``step_s + budget x token_s``) and a last one with the rest (``step_s + rest x token_s``).
- A stream ``[first_token, finish]`` overlapping a fraction ``f`` of an interval sees ``f x k``
  of its steps (one token each, at those steps' lengths); the rest of its stream, when the
  engine computes no prefill, gets a token every ``decode_s_per_token`` (the timing models'
  decode pace, so a colocated engine's idle stretches match its TTFT model exactly).

What this leaves out: in the ``fcfs`` model a stream's finish does not move when prefills
lengthen its steps (its TTFT and finish stay as committed); decode-only steps do not grow with
the number of running requests. Both make the absolute ITL figures a lower bound; the
comparison between colocated and disaggregated engines is what they are for.
"""

from __future__ import annotations

import math
from bisect import bisect_right

from benchkit.itl import ItlSamples
from emulator.steps import step_overhead_s
from emulator.timing import TimingParams


class EngineItl:
    """One engine's prefill intervals and measured streams; :meth:`collect` at the end."""

    __slots__ = ("_budget", "_decode_s", "_ends", "_full_s", "_starts", "_step_s", "_token_s",
                 "_tokens", "_windows")

    def __init__(self, timing: TimingParams) -> None:
        self._step_s = step_overhead_s(timing)
        self._token_s = 1.0 / timing.prefill_tokens_per_s
        self._budget = max(1, timing.max_num_batched_tokens)
        self._full_s = self._step_s + self._budget * self._token_s
        self._decode_s = timing.decode_s_per_token
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._tokens: list[int] = []
        self._windows: list[tuple[float, float]] = []

    def prefill(self, start: float, end: float, tokens: int) -> None:
        """A prefill of ``tokens`` ran over ``[start, end]`` (admissions come in time order)."""
        if not end > start:
            return
        ends = self._ends
        if ends and start <= ends[-1]:  # overlapping prefills (the step model): one busy span
            ends[-1] = max(ends[-1], end)
            self._tokens[-1] += max(1, tokens)
            return
        self._starts.append(start)
        ends.append(end)
        self._tokens.append(max(1, tokens))

    def stream(self, first_token: float, finish: float) -> None:
        """A measured request streamed its tokens over ``[first_token, finish]``."""
        if finish > first_token:
            self._windows.append((first_token, finish))

    def collect(self, into: ItlSamples) -> None:
        """Every measured stream's gaps, added to ``into``."""
        starts, ends = self._starts, self._ends
        for a, b in self._windows:
            k = bisect_right(ends, a)  # the first interval ending after the stream starts
            busy = 0.0
            while k < len(starts) and starts[k] < b:
                overlap = min(b, ends[k]) - max(a, starts[k])
                if overlap > 0:
                    busy += overlap
                    self._steps(k, overlap / (ends[k] - starts[k]), into)
                k += 1
            into.add(self._decode_s, ((b - a) - busy) / self._decode_s)

    def _steps(self, k: int, share: float, into: ItlSamples) -> None:
        tokens = self._tokens[k]
        steps = math.ceil(tokens / self._budget)
        if steps > 1:
            into.add(self._full_s, share * (steps - 1))
        rest = tokens - (steps - 1) * self._budget
        into.add(self._step_s + rest * self._token_s, share)
