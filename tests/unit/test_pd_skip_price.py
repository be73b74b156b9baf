"""`disaggregation.skip_rule: streams`: a short turn stays on its decode engine only when its
prefill costs that engine's streams fewer seconds than disaggregating costs the turn."""

from __future__ import annotations

import pytest

from kvgate.config import load_text
from kvgate.config.sections.disaggregation import SkipRule
from kvgate.endpoints.directory import EndpointDirectory
from kvgate.pd.decider import Path, PrefillDecider
from kvgate.pd.skip_price import SkipPrice
from kvgate.placement.cost import EngineCost

PD = """
pools:
  - name: coder
    endpoints:
      - {address: 10.0.0.1:8000, role: prefill}
      - {address: 10.0.0.3:8000, role: decode}
"""
D = "10.0.0.3:8000"
COST = EngineCost()  # 5,000 tok/s, c0 20 ms, 256 KiB a token, 20 GB/s + 3 ms


def test_the_stall_is_every_running_stream_waiting_for_the_prefills_compute() -> None:
    price = SkipPrice(COST)
    assert price.stall_s(10, 500) == pytest.approx(10 * 500 / 5000)
    assert price.stall_s(0, 500) == 0.0


def test_disaggregating_costs_the_queue_or_the_pool_read_the_answer_and_the_pull() -> None:
    price = SkipPrice(COST)
    # 10,000-token prompt, 500 lacking; the pool holds the last remote prompt (9,000): the
    # decode engine's 9,500 held less 9,000 pooled = 500 recomputed.
    pull, c0 = COST.transfer_s(500), COST.prefill_overhead_s
    idle = price.remote_s(500, 10_000, 9000, 0.0)
    assert idle == pytest.approx(COST.transfer_s(9000) + 500 / 5000 + pull + c0)
    queued = price.remote_s(500, 10_000, 9000, 5.0)  # a queue hides the pool read
    assert queued == pytest.approx(5.0 + 500 / 5000 + pull + c0)
    # The pool cannot hold more than the decode engine does of this prompt.
    assert price.remote_s(500, 10_000, 20_000, 0.0) == pytest.approx(
        COST.transfer_s(9500) + pull + c0)


def decider(running: int | None, backlog: float = 0.0,
            rule: SkipRule = SkipRule.STREAMS) -> PrefillDecider:
    return PrefillDecider(EndpointDirectory(load_text(PD)), 2048, cost=COST, rule=rule,
                          backlog_s=lambda address: backlog,
                          running=lambda address: running)


def test_a_short_turn_goes_remote_when_the_decode_engines_streams_would_pay_more() -> None:
    busy = decider(running=40)
    assert busy.plan("coder", D, "s", 20_000).path is Path.REMOTE  # new: lacks it all
    # 1,000 more tokens: 40 streams x 0.2 s = 8 s against ~0.8 s for the turn.
    plan = busy.plan("coder", D, "s", 21_000)
    assert (plan.path, plan.prefill, plan.lacking_tokens) == (Path.REMOTE, "10.0.0.1:8000", 1000)
    # One stream: 0.2 s against the turn's ~0.3 s (the pool read of 20,000 tokens); it stays.
    few = decider(running=1)
    few.plan("coder", D, "s", 20_000)
    assert few.plan("coder", D, "s", 21_000).path is Path.CACHED


def test_a_long_prefill_queue_keeps_the_turn_on_its_decode_engine() -> None:
    queued = decider(running=40, backlog=30.0)
    queued.plan("coder", D, "s", 20_000)
    assert queued.plan("coder", D, "s", 21_000).path is Path.CACHED


def test_unknown_streams_or_the_threshold_rule_keep_todays_decision() -> None:
    for d in (decider(running=None), decider(running=0),
              decider(running=40, rule=SkipRule.THRESHOLD)):
        d.plan("coder", D, "s", 20_000)
        assert d.plan("coder", D, "s", 21_000).path is Path.CACHED
    # Above the threshold the rule changes nothing: remote.
    assert decider(running=0).plan("coder", D, "t", 5000).path is Path.REMOTE


def test_the_pool_is_taken_to_hold_the_last_remote_prompt_only() -> None:
    # A turn kept on its decode engine writes nothing to the pool: the next turn's recompute
    # grows by what that turn added, and a busy engine's streams no longer outweigh it.
    d = decider(running=3)
    d.plan("coder", D, "s", 20_000)  # remote: the pool holds 20,000
    assert d.plan("coder", D, "s", 20_400).path is Path.CACHED  # 3 x 0.08 s < ~0.29 s
    # The pool still holds 20,000 of the 20,400 held: remote costs the read plus 400 tokens.
    price = SkipPrice(COST)
    assert price.remote_s(1500, 21_900, 20_000, 0.0) == pytest.approx(
        COST.transfer_s(20_000) + 400 / 5000 + COST.transfer_s(1500) + COST.prefill_overhead_s)


def test_streams_measures_what_a_turn_added_in_one_unit_and_adds_what_was_evicted() -> None:
    # KV events count tokens; the prompt is estimated from the body. A session whose estimate
    # reads low (9,000 for ~10,000 held) would lack nothing by estimate - held.
    held = {"s": 10_000}
    d = PrefillDecider(EndpointDirectory(load_text(PD)), 2048, cost=COST,
                       rule=SkipRule.STREAMS, running=lambda address: 0,
                       hbm_tokens=lambda e, s, n: min(n, held[s]))
    d.plan("coder", D, "s", 9000)  # lacks 0 by its KV events: stays (no streams)
    grown = d.plan("coder", D, "s", 10_500)
    assert (grown.lacking_tokens, grown.source) == (1500, "binding")  # the growth, not 500
    held["s"] = 4000  # evicted: the estimate less what it holds is now the larger
    assert d.plan("coder", D, "s", 10_800).lacking_tokens == 10_800 - 4000
    threshold = PrefillDecider(EndpointDirectory(load_text(PD)), 2048,
                               hbm_tokens=lambda e, s, n: min(n, 10_000))
    threshold.plan("coder", D, "s", 9000)
    assert threshold.plan("coder", D, "s", 10_500).lacking_tokens == 500  # today's reading
