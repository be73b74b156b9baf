"""`kvgate simulate --pd P:D`: the inter-token latency accounting, the peers' P/D picking rules
on hand-built cases, and whole P/D simulations on a small fleet."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

import pytest
from bench_helpers import small_bank

from benchkit.itl import ItlSamples
from emulator.options import EmulatorOptions
from emulator.timing import TimingParams
from kvgate.config.sections.disaggregation import SkipRule
from kvgate.contract.modes import PdMode, RoutingMode
from kvgate.runtime.tasks.loop import run as run_loop
from simulator.command import add_arguments
from simulator.itl import EngineItl
from simulator.pd_flags import check_pd, parse_modes, parse_split
from simulator.pd_routers import DynamoPd, LlmdPd, PdPick, VllmAscendPd
from simulator.pd_simulation import PdSimulation
from simulator.routing import Ask
from simulator.run import SimConfig, simulate

P1, P2, D1, D2 = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.1.1:8000", "10.0.1.2:8000"


def _ask(tokens: int, session: str = "s", hashes: Sequence[int] = (1,)) -> Ask:
    return Ask(session, tokens, tokens, hashes)


def _pick(router: object, ask: Ask) -> PdPick | None:
    return asyncio.run(router.pick(ask, 0.0))  # type: ignore[attr-defined]


def _holding(**tokens: int) -> object:
    """``cached(engine, blocks)``: what each engine holds, set by hand (p1, p2, d1, d2)."""
    by_address = {P1: tokens.get("p1", 0), P2: tokens.get("p2", 0), D1: tokens.get("d1", 0),
                  D2: tokens.get("d2", 0)}
    return lambda address, hashes: by_address[address]


def test_itl_percentiles_are_token_weighted() -> None:
    samples = ItlSamples()
    samples.add(0.035, 98.0)
    samples.add(0.444, 2.0)
    assert samples.percentile(50) == pytest.approx(0.035)
    assert samples.percentile(99) == pytest.approx(0.444)
    assert ItlSamples().percentile(99) is None


def test_a_stream_sees_the_steps_of_the_prefill_it_overlaps() -> None:
    timing = TimingParams()  # 5,000 tok/s, 35 ms a token, 2,048-token steps
    engine = EngineItl(timing)
    engine.prefill(10.0, 11.0, 4096 + 100)  # three steps: two full ones, one of 100 tokens
    engine.stream(0.0, 20.0)  # spans it
    engine.stream(30.0, 31.0)  # after it: decode steps only
    samples = ItlSamples()
    engine.collect(samples)
    step_s = timing.decode_s_per_token - 1 / timing.prefill_tokens_per_s
    full = round(step_s + 2048 / timing.prefill_tokens_per_s, 4)
    assert samples.weights[round(full / 1e-4)] == pytest.approx(2.0)
    assert samples.weights[round((step_s + 100 / 5000) / 1e-4)] == pytest.approx(1.0)
    # The rest of both streams: one token every 35 ms.
    assert samples.weights[round(0.035 / 1e-4)] == pytest.approx((19.0 + 1.0) / 0.035)


def test_overlapping_prefills_count_as_one_busy_span() -> None:
    engine = EngineItl(TimingParams())
    engine.prefill(0.0, 1.0, 1000)
    engine.prefill(0.5, 1.5, 1000)  # the step model's chunks interleave
    engine.stream(0.0, 2.0)
    samples = ItlSamples()
    engine.collect(samples)
    assert samples.tokens == pytest.approx(1.0 + 0.5 / 0.035)  # one 2,000-token step, then idle


def test_vllm_ascend_weighs_a_prefill_engine_s_held_kv_at_0_3() -> None:
    router = VllmAscendPd([P1, P2], [D1, D2])
    first = _pick(router, _ask(1000))
    assert first == PdPick(D1, P1)  # ties: the first engine
    router.prefill_done(P1, _ask(1000), 1.0)  # P1: 0 active tokens, 1,000 KV not yet pulled
    router.active_tokens[P2] = 200.0
    assert _pick(router, _ask(10)) == PdPick(D2, P2)  # 200 < 0.3 x 1,000; D1 still streams
    router.pulled(P1, _ask(1000), 2.0)
    router.decode_done(D1, _ask(1000), 3.0)
    assert router.active_kv[P1] == 0 and router.active_tokens[D1] == 0


def test_llm_d_decides_on_the_decode_pod_and_keeps_the_session_there() -> None:
    router = LlmdPd([P1, P2], [D1, D2], _holding(d2=5000, p2=4000))  # type: ignore[arg-type]
    pick = _pick(router, _ask(5010, "a"))
    assert pick == PdPick(D2, None)  # D2 holds all but 10 tokens: under nonCachedTokens (16)
    pick = _pick(router, _ask(9000, "a"))
    assert pick is not None and pick.decode == D2 and pick.prefill == P2  # P2's prefix wins
    assert _pick(router, _ask(9000, "b")) == PdPick(D2, P1)  # P2 now busy; D2 still holds most
    router.last.clear()
    disabled = LlmdPd([P1], [D1], _holding(), non_cached_tokens=0)  # type: ignore[arg-type]
    assert _pick(disabled, _ask(9000)) == PdPick(D1, None)  # 0 turns P/D off


@pytest.mark.parametrize(("raw", "held", "remote"), [
    (10_000, 9_000, False),  # 1,000 effective: under 2,048 and under 0.7 of the raw prompt
    (1_500, 0, True),  # under 2,048 but all of the raw prompt
    (10_000, 7_000, True),  # 3,000: over 2,048
])
def test_dynamo_conditional_disaggregation(raw: int, held: int, remote: bool) -> None:
    router = DynamoPd([P1, P2], [D1], _holding(d1=held), block_size=16)  # type: ignore[arg-type]
    pick = _pick(router, _ask(raw))
    assert pick is not None and pick.decode == D1 and (pick.prefill is not None) == remote


def test_dynamo_prefills_by_kv_cost_and_decodes_by_load() -> None:
    router = DynamoPd([P1, P2], [D1, D2], _holding(p2=3200), block_size=16)  # type: ignore[arg-type]
    assert _pick(router, _ask(3200)) == PdPick(D1, P2)  # P2 holds the prompt: 0 blocks to do
    assert _pick(router, _ask(3200, hashes=(2,))) == PdPick(D2, P1)  # P2 has 200 active blocks
    router.decode_done(D1, _ask(3200), 1.0)
    assert router.active[D1] == 0


def test_flags_parse_the_split_and_the_pd_modes() -> None:
    assert parse_split("4:12") == (4, 12)
    for bad in ("4", "0:16", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError, match="P:D"):
            parse_split(bad)
    assert parse_modes("pd") == (RoutingMode.AFFINITY_DDR, *PdMode)
    assert parse_modes("affinity+ddr,pd-dynamo") == (RoutingMode.AFFINITY_DDR, PdMode.DYNAMO)
    with pytest.raises(ValueError, match="unknown P/D mode"):
        parse_modes("pd-nope")


@pytest.mark.parametrize(("argv", "error"), [
    (["--modes", "pd-kvgate"], "needs --pd"),
    (["--modes", "pd", "--pd", "4:8"], "is 12 engines"),
    (["--modes", "pd", "--pd", "4:12", "--skip-prefill-below", "-1"], ">= 0"),
    (["--modes", "pd", "--pd", "4:12", "--fail", "3@10"], "not simulated"),
])
def test_the_command_refuses_what_it_cannot_simulate(argv: list[str], error: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--engines", "16", *argv])
    with pytest.raises(ValueError, match=error):
        check_pd(args, 16)


def _config(**fields: object) -> SimConfig:
    return SimConfig(EmulatorOptions(instances=4, block_size=16), pd=(1, 3), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", list(PdMode))
def test_a_pd_run_reports_its_figures_and_skipped_turns_never_reach_a_prefill_engine(
        mode: PdMode) -> None:
    workload = small_bank(sessions=12, duration_s=240.0, context=3000)
    simulation = PdSimulation(workload, mode, _config(hbm_residency=True))
    result = run_loop(simulation.run())
    figures = result.stats.figures()
    assert figures["requests"] == len(workload.requests) and figures["errors"] == 0
    assert figures["itl_p50_s"] is not None and figures["itl_p99_s"] >= figures["itl_p50_s"]
    skipped = [i for i, e in enumerate(simulation.prefilled_on) if e >= 1]
    remote = [i for i, e in enumerate(simulation.prefilled_on) if e == 0]
    assert len(skipped) + len(remote) == len(workload.requests)
    assert figures["prefill_skipped_share"] == pytest.approx(len(skipped) / len(workload.requests))
    # The prefill engine saw exactly the remote turns, once each; every turn decoded elsewhere.
    assert simulation.fleet.engines[0].stats.requests == len(remote)
    assert result.per_engine_requests[0] == len(remote)
    assert all(e >= 1 for e in result.assignments)
    if mode is PdMode.VLLM_ASCEND:
        assert not skipped  # it never skips
    if mode in (PdMode.KVGATE, PdMode.DYNAMO):
        assert skipped  # short follow-up turns stay on their decode engine


def test_colocated_modes_report_itl_and_no_skipped_share() -> None:
    workload = small_bank(sessions=12, duration_s=240.0)
    figures = simulate(workload, RoutingMode.AFFINITY_DDR, _config()).stats.figures()
    assert figures["itl_p50_s"] == pytest.approx(0.035)
    assert "prefill_skipped_share" not in figures


def test_a_pd_mode_without_a_split_is_refused() -> None:
    workload = small_bank(sessions=2, duration_s=60.0)
    with pytest.raises(ValueError, match="--pd"):
        simulate(workload, PdMode.KVGATE, SimConfig(EmulatorOptions(instances=4)))
    with pytest.raises(ValueError, match="needs 5 engines"):
        simulate(workload, PdMode.KVGATE, SimConfig(EmulatorOptions(instances=4), pd=(1, 4)))


def test_the_streams_rule_reads_the_decode_engines_running_requests_from_their_scrapes() -> None:
    workload = small_bank(sessions=24, duration_s=240.0, context=3000)
    simulation = PdSimulation(workload, PdMode.KVGATE,
                              _config(hbm_residency=True, skip_rule=SkipRule.STREAMS))
    figures = run_loop(simulation.run()).stats.figures()
    assert figures["errors"] == 0 and 0 < figures["prefill_skipped_share"] < 1
    router = simulation.pd
    assert router.decider.rule is SkipRule.STREAMS  # type: ignore[attr-defined]
    # Skipped turns were prefilled on their decode engine, remote ones on the prefill engine.
    remote = sum(e == 0 for e in simulation.prefilled_on)
    assert simulation.fleet.engines[0].stats.requests == remote
    # What the rule weighs: the decode engines' scraped running requests.
    counts = [router._running(a) for a in simulation.addresses[1:]]  # type: ignore[attr-defined]
    assert all(isinstance(c, int) and c >= 0 for c in counts)
