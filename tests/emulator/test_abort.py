"""An aborted request (its client went away) in the timing models: it stops counting as running
or waiting, and what it had not used of its slot, the prefill stage or the engine's steps goes to
the requests that arrive after it (emulator/timing.py and emulator/steps.py ``release``)."""

from __future__ import annotations

from emulator.engine_model import EngineConfig, EngineModel
from emulator.steps import StepScheduler
from emulator.timing import VLLM_STEPS, Scheduler, TimingParams


def test_fcfs_an_abort_frees_the_slot_and_the_prefill_stage_for_later_arrivals() -> None:
    scheduler = Scheduler(max_num_seqs=1)
    first = scheduler.schedule(0.0, prefill_s=1.0, decode_s=100.0)  # holds the only slot
    queued = scheduler.schedule(1.0, prefill_s=1.0, decode_s=100.0)  # waits for it
    assert queued.start == first.finish and scheduler.occupancy(2.0) == (1, 1)

    scheduler.release(queued, 3.0)
    assert scheduler.occupancy(3.0) == (1, 0)
    scheduler.release(first, 4.0)
    assert scheduler.occupancy(4.0) == (0, 0)
    later = scheduler.schedule(5.0, prefill_s=1.0, decode_s=1.0)
    assert (later.start, later.prefill_start, later.first_token) == (5.0, 5.0, 6.0)


def test_fcfs_an_abort_in_the_prefill_queue_gives_its_unused_prefill_time_back() -> None:
    scheduler = Scheduler(max_num_seqs=8)
    scheduler.schedule(0.0, prefill_s=10.0, decode_s=0.0)
    middle = scheduler.schedule(0.0, prefill_s=10.0, decode_s=0.0)  # prefills 10 to 20
    last = scheduler.schedule(0.0, prefill_s=10.0, decode_s=0.0)  # 20 to 30: keeps its turn
    assert last.first_token == 30.0
    scheduler.release(middle, 5.0)
    assert scheduler.occupancy(5.0) == (2, 0)
    assert scheduler.schedule(6.0, prefill_s=1.0, decode_s=0.0).prefill_start == 20.0


def test_a_finished_request_released_late_changes_nothing() -> None:
    scheduler = Scheduler(max_num_seqs=1)
    done = scheduler.schedule(0.0, prefill_s=1.0, decode_s=1.0)
    scheduler.release(done, 5.0)
    again = Scheduler(max_num_seqs=1)
    again.schedule(0.0, prefill_s=1.0, decode_s=1.0)
    assert scheduler.schedule(6.0, 1.0, 1.0) == again.schedule(6.0, 1.0, 1.0)


STEPS = TimingParams(scheduler=VLLM_STEPS, max_num_batched_tokens=512, max_num_seqs=4)


def test_steps_an_abort_before_its_first_step_leaves_the_steps_as_if_it_never_came() -> None:
    aborted, fresh = StepScheduler(STEPS), StepScheduler(STEPS)
    gone = aborted.schedule(0.0, prefill_tokens=4000, output_tokens=200)
    aborted.release(gone, 0.001)  # before it reached the engine core (prefill_overhead_s)
    assert aborted.occupancy(0.001) == (0, 0)
    assert aborted.schedule(0.002, 100, 10) == fresh.schedule(0.002, 100, 10)


def test_steps_an_abort_mid_answer_shortens_the_steps_it_would_have_shared() -> None:
    aborted, kept = StepScheduler(STEPS), StepScheduler(STEPS)
    for scheduler in (aborted, kept):
        long = scheduler.schedule(0.0, prefill_tokens=100, output_tokens=2000)
    mid = (long.first_token + long.finish) / 2
    assert aborted.occupancy(mid) == (1, 0)
    aborted.release(long, mid)
    assert aborted.occupancy(mid) == (0, 0)
    # A later arrival decodes alone, no longer beside the abandoned answer's tokens.
    assert aborted.schedule(mid, 3000, 50).finish < kept.schedule(mid, 3000, 50).finish


def test_the_model_aborts_through_its_scheduler_and_unpins_the_blocks() -> None:
    model = EngineModel(EngineConfig(block_size=16, hbm_tokens=10_000,
                                     timing=TimingParams(max_num_seqs=1)))
    tokens = list(range(1000))
    admission = model.admit(0.0, model.probe(0.0, tokens), 500)
    assert model.occupancy(1.0) == (1, 0) and model.usage(1.0) > 0
    model.abort(admission, 1.0)
    assert model.occupancy(1.0) == (0, 0)
    assert model.cache.usage() == 0.0
    again = model.admit(2.0, model.probe(2.0, [7] * 100), 5)
    assert again.slot.start == 2.0  # the only slot is free, not held until 1000 tokens end
