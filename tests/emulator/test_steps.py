"""The step model (``--scheduler vllm-steps``, emulator.steps) against hand-computed schedules.

Round numbers throughout: 1,000 tokens/s (1 ms a token), a lone decode step of 11 ms (so the
fixed cost of a step is 10 ms), 5 ms in the API server before the engine core sees a request,
a budget of 2,048 tokens a step.
"""

from __future__ import annotations

import argparse

import pytest

from benchkit.fleet_options import emulator_flags
from emulator.command import add_arguments, options_from_args
from emulator.engine_model import EngineConfig, EngineModel
from emulator.options import EmulatorOptions
from emulator.steps import StepScheduler
from emulator.timing import FCFS, VLLM_STEPS, Scheduler, TimingParams

RATE, DECODE_S, ENTRY_S, BUDGET = 1000.0, 0.011, 0.005, 2048
STEP_S = 0.010  # DECODE_S less one token's 1 ms


def steps(max_num_seqs: int = 16, budget: int = BUDGET) -> StepScheduler:
    return StepScheduler(TimingParams(
        prefill_tokens_per_s=RATE, decode_s_per_token=DECODE_S, prefill_overhead_s=ENTRY_S,
        max_num_seqs=max_num_seqs, scheduler=VLLM_STEPS, max_num_batched_tokens=budget))


def test_step_cost_is_a_lone_decode_less_its_token() -> None:
    assert steps().step_s == pytest.approx(STEP_S)


def test_a_lone_request() -> None:
    # Reaches the engine at 5 ms; one step of 10 ms + 500 tokens; then 3 decode steps of 11 ms.
    slot = steps().schedule(0.0, 500, 4)
    assert slot.prefill_start == pytest.approx(0.005)
    assert slot.first_token == pytest.approx(0.005 + 0.010 + 0.500)
    assert slot.ttft == pytest.approx(0.515)
    assert slot.finish == pytest.approx(0.515 + 3 * 0.011)


def test_a_prefill_chunked_over_the_budget() -> None:
    # 3,000 tokens: 2,048 in the first step, 952 in the second; the first token ends the second.
    slot = steps().schedule(0.0, 3000, 1)
    first = 0.005 + (0.010 + 2.048)
    assert slot.first_token == pytest.approx(first + 0.010 + 0.952)
    assert slot.finish == slot.first_token  # one output token: nothing to decode


def test_a_prefill_shares_its_step_with_running_decodes() -> None:
    model = steps()
    a = model.schedule(0.0, 100, 50)  # prefill step ends at 0.005 + 0.110 = 0.115
    assert a.first_token == pytest.approx(0.115)
    # B reaches the engine at 0.125, during A's first decode step (0.115-0.126): it joins the
    # next step (0.126), whose tokens are A's decode and B's 200 prompt tokens.
    b = model.schedule(0.120, 200, 2)
    assert b.prefill_start == pytest.approx(0.126)
    assert b.first_token == pytest.approx(0.126 + 0.010 + 0.201)
    # Its one decode step carries A's next decode token too: 10 ms + 2 tokens.
    assert b.finish == pytest.approx(b.first_token + 0.012)


def test_waiting_requests_are_served_first_come_first_served() -> None:
    model = steps()
    model.schedule(0.0, 3000, 1)  # steps 0 (2,048 tokens, to 2.063) and 1 (952 tokens)
    # B and C arrive during step 0; B came first, so B takes the budget step 1 leaves
    # (1,096 tokens) and C the rest of its own prompt after B's.
    b = model.schedule(0.100, 1000, 1)
    c = model.schedule(0.200, 500, 1)
    step1_start = 0.005 + 0.010 + 2.048
    # Step 1 holds 952 + 1,000 + 96 of C's tokens = 2,048; C's last 404 tokens go in step 2.
    step1_end = step1_start + 0.010 + 2.048
    assert b.prefill_start == pytest.approx(step1_start)
    assert c.prefill_start == pytest.approx(step1_start)
    assert c.first_token == pytest.approx(step1_end + 0.010 + 0.404)
    # B's first token was fixed when B arrived, before C's 96 tokens joined its last step: the
    # closed form's one deviation (emulator.steps), 96 ms early here.
    assert b.first_token == pytest.approx(step1_end - 0.096)


def test_a_full_running_batch_holds_new_requests_back() -> None:
    model = steps(max_num_seqs=1)
    a = model.schedule(0.0, 100, 3)  # runs until 0.115 + 2 x 0.011 = 0.137
    b = model.schedule(0.010, 100, 1)
    assert b.prefill_start == pytest.approx(a.finish)
    assert b.first_token == pytest.approx(a.finish + 0.110)
    assert model.occupancy(0.120) == (1, 1)


def test_an_idle_engine_starts_at_once_and_forgets_finished_steps() -> None:
    model = steps()
    model.schedule(0.0, 100, 2)  # done by 0.126
    later = model.schedule(5.0, 100, 2)
    assert later.prefill_start == pytest.approx(5.005)
    assert later.first_token == pytest.approx(5.115)
    assert model.occupancy(10.0) == (0, 0)


def test_the_default_model_is_the_serial_queue() -> None:
    # Nothing chose vllm-steps: the engine runs emulator.timing's Scheduler, as before.
    assert EmulatorOptions().scheduler == FCFS
    assert isinstance(EngineModel(EmulatorOptions().engine_config()).scheduler, Scheduler)
    stepped = EmulatorOptions(scheduler=VLLM_STEPS).engine_config()
    assert isinstance(EngineModel(stepped).scheduler, StepScheduler)
    with pytest.raises(ValueError, match="scheduler must be one of"):
        EmulatorOptions(scheduler="sjf").validate()
    # The per-prompt-token cost is off unless asked for (every committed figure), never < 0.
    assert EmulatorOptions().timing().prompt_s_per_token == 0.0
    assert EmulatorOptions(prompt_us_per_token=6.0).timing().prompt_s_per_token == 6e-6
    with pytest.raises(ValueError, match="prompt_us_per_token must be >= 0"):
        EmulatorOptions(prompt_us_per_token=-1.0).validate()


def test_the_engine_model_under_steps_counts_cached_tokens_out() -> None:
    timing = TimingParams(prefill_tokens_per_s=RATE, decode_s_per_token=DECODE_S,
                          prefill_overhead_s=ENTRY_S, scheduler=VLLM_STEPS)
    model = EngineModel(EngineConfig(block_size=16, hbm_tokens=10_000, timing=timing))
    tokens = list(range(320))
    first = model.admit(0.0, model.probe(0.0, tokens), 2)
    assert first.slot.ttft == pytest.approx(0.005 + 0.010 + 0.320)
    # The same prompt later: 304 tokens cached (n - 1 capped to whole blocks), 16 computed.
    again = model.admit(10.0, model.probe(10.0, tokens), 2)
    assert again.hbm_hit_tokens == 304
    assert again.slot.ttft == pytest.approx(0.005 + 0.010 + 0.016)
    assert model.token_interval(again.slot, 2) == pytest.approx(0.011)


def test_the_flag_reaches_the_options_and_the_fleet_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = options_from_args(parser.parse_args([]))
    assert (default.scheduler, default.max_num_batched_tokens) == (FCFS, 2048)
    assert "--scheduler" not in emulator_flags(default)  # default runs: the same command line
    chosen = options_from_args(parser.parse_args(
        ["--scheduler", "vllm-steps", "--max-num-batched-tokens", "512"]))
    assert chosen.timing().scheduler == VLLM_STEPS
    assert chosen.timing().max_num_batched_tokens == 512
    again = options_from_args(parser.parse_args(list(emulator_flags(chosen))))
    assert (again.scheduler, again.max_num_batched_tokens) == (VLLM_STEPS, 512)
