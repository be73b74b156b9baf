"""Engine timing: slots, a serial prefill queue, and TTFT / decode durations (pure, no I/O).

All times are emulated seconds. Requests are admitted in arrival order (first come, first served):
a request waits for one of ``max_num_seqs`` slots, then for the prefill stage (one prefill at a
time, like a saturated chunked-prefill budget), then prefills, then decodes in its slot. Because
arrivals are handled in time order, each request's schedule is known when it arrives, so the
schedule is computed in closed form with two heaps instead of simulating events; a discrete-event
simulator and the live server share this code.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass
from typing import NamedTuple

# The timing models: ``fcfs`` (this module: a serial prefill queue, decode free to others; the
# default, behind every committed figure) and ``vllm-steps`` (emulator.steps: vLLM's step loop).
FCFS = "fcfs"
VLLM_STEPS = "vllm-steps"
SCHEDULERS = (FCFS, VLLM_STEPS)
# vLLM 0.32's max_num_batched_tokens for the OpenAI server on CPU (engine/arg_utils.py
# EngineArgs.get_batch_defaults); only the step model uses it.
CPU_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class TimingParams:
    """Engine speed. Defaults: a Qwen2.5-32B-class model on one device (see DESIGN.md)."""

    prefill_tokens_per_s: float = 5000.0
    decode_s_per_token: float = 0.035
    prefill_overhead_s: float = 0.02  # c0: scheduling, sampling, first-step launch
    # Work per prompt token whether its KV is cached or not, before the first step: vLLM 0.32
    # tokenizes the whole prompt inside its TTFT clock (vllm/renderers/base.py
    # render_cmpl_async → tokenize_prompts), hashes every full block of it when the engine core
    # makes the request (vllm/v1/core/kv_cache_utils.py get_request_block_hasher) and looks
    # them up (vllm/v1/core/kv_cache_manager.py get_computed_blocks). 0: not charged (every
    # committed figure); the calibration fits it (real_vllm.calibrate).
    prompt_s_per_token: float = 0.0
    kv_bytes_per_token: int = 256 * 1024
    ddr_bytes_per_s: float = 20e9
    max_num_seqs: int = 256
    scheduler: str = FCFS  # which timing model (SCHEDULERS)
    max_num_batched_tokens: int = CPU_MAX_NUM_BATCHED_TOKENS  # a step's token budget (steps)

    def prefill_seconds(self, computed_tokens: int, ddr_tokens: int,
                        prompt_tokens: int = 0) -> float:
        """Service time of a prefill: c0 + the prompt's per-token work + computed tokens / rate
        + DDR-loaded bytes / bandwidth."""
        seconds = (self.prefill_overhead_s + prompt_tokens * self.prompt_s_per_token
                   + computed_tokens / self.prefill_tokens_per_s)
        if ddr_tokens:
            seconds += ddr_tokens * self.kv_bytes_per_token / self.ddr_bytes_per_s
        return seconds

    def decode_seconds(self, output_tokens: int) -> float:
        """Time from the first output token to the last."""
        return max(0, output_tokens - 1) * self.decode_s_per_token


class Slot(NamedTuple):
    """One request's schedule, in emulated seconds."""

    arrival: float
    start: float  # got a slot
    prefill_start: float
    first_token: float
    finish: float

    @property
    def ttft(self) -> float:
        """Time to first token, queueing included."""
        return self.first_token - self.arrival

    @property
    def queue_wait(self) -> float:
        """Time spent waiting for a slot and for the prefill stage."""
        return self.prefill_start - self.arrival


class Scheduler:
    """First-come-first-served slot and prefill scheduling; call :meth:`schedule` in time order."""

    def __init__(self, max_num_seqs: int) -> None:
        if max_num_seqs <= 0:
            raise ValueError("max_num_seqs must be positive")
        self.max_num_seqs = max_num_seqs
        self._slot_free: list[float] = []  # finish times of requests holding slots (min-heap)
        self._prefill_free_at = float("-inf")
        self._not_started: list[float] = []  # slot start times still in the future (min-heap)
        self._not_finished: list[float] = []  # finish times still in the future (min-heap)
        # First tokens (prefill ends) still in the future, in order: the prefill stage is
        # serial, so each new one is the latest, and the last is ``_prefill_free_at``.
        self._prefill_ends: list[float] = []

    def prefill_start(self, now: float) -> float:
        """When a request arriving at ``now`` would start its prefill (nothing is reserved)."""
        start = now
        if len(self._slot_free) >= self.max_num_seqs:
            start = max(now, self._slot_free[0])
        return max(start, self._prefill_free_at)

    def schedule(self, now: float, prefill_s: float, decode_s: float) -> Slot:
        """Reserve a slot and a prefill turn for a request arriving at ``now``."""
        # Prune here too: without scrapes calling occupancy() the heaps would grow forever.
        self._prune(now)
        if len(self._slot_free) < self.max_num_seqs:
            start = now
        else:
            start = max(now, heapq.heappop(self._slot_free))
        prefill_start = max(start, self._prefill_free_at)
        first_token = prefill_start + prefill_s
        self._prefill_free_at = first_token
        self._prefill_ends.append(first_token)
        finish = first_token + decode_s
        heapq.heappush(self._slot_free, finish)
        heapq.heappush(self._not_started, start)
        heapq.heappush(self._not_finished, finish)
        return Slot(now, start, prefill_start, first_token, finish)

    def release(self, slot: Slot, now: float) -> None:
        """The request given ``slot`` was aborted at ``now`` (its client went away; vLLM aborts
        such a request and frees what it holds): it stops counting as running or waiting, its
        slot is free from ``now``, and the prefill time it had not used yet goes back to the
        prefill stage. Requests scheduled before the abort keep their times (the schedule is
        closed form); those arriving after it get what it freed."""
        if slot.finish <= now:
            return  # over already: nothing left to free
        discard(self._not_finished, slot.finish)
        if slot.start > now:
            discard(self._not_started, slot.start)
        # Absent when a later request, all slots busy then, was given this one at its finish.
        discard(self._slot_free, slot.finish)
        if slot.first_token <= now:
            return  # its prefill is over: the stage has nothing to give back
        ends = self._prefill_ends
        last = bool(ends) and ends[-1] == slot.first_token
        if slot.first_token in ends:
            ends.remove(slot.first_token)
        if last:  # the latest reservation: the stage is free when the one before it ends
            self._prefill_free_at = max(now, ends[-1]) if ends else now
        else:  # requests after it keep their turns; later arrivals get its unused time
            unused = slot.first_token - max(now, slot.prefill_start)
            self._prefill_free_at = max(now, self._prefill_free_at - unused)

    def occupancy(self, now: float) -> tuple[int, int]:
        """``(running, waiting)`` at ``now``: requests holding a slot, and those queued for one.

        ``now`` must not go backwards between calls.
        """
        self._prune(now)
        waiting = len(self._not_started)
        return len(self._not_finished) - waiting, waiting

    def _prune(self, now: float) -> None:
        while self._not_started and self._not_started[0] <= now:
            heapq.heappop(self._not_started)
        while self._not_finished and self._not_finished[0] <= now:
            heapq.heappop(self._not_finished)
        ends = self._prefill_ends
        if ends and ends[0] <= now:
            del ends[: bisect_right(ends, now)]


def discard(heap: list[float], value: float) -> None:
    """Remove one ``value`` from a min-heap, if it holds one (O(n): heaps of in-flight
    requests, an abort at a time)."""
    try:
        heap.remove(value)
    except ValueError:
        return
    heapq.heapify(heap)
