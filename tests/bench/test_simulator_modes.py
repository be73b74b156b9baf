from __future__ import annotations

from collections import defaultdict

import pytest
from bench_helpers import small_bank

from benchkit.modes import ALL_MODES
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from simulator.run import FleetEvent, SimConfig, SimResult, simulate
from simulator.sending import NEVER, SendOrder
from workload.hashing import oracle_hit_rate
from workload.model import Request, Segment, Workload


def _config(engines: int = 4, **kw: object) -> SimConfig:
    return SimConfig(EmulatorOptions(instances=engines, block_size=16), **kw)  # type: ignore[arg-type]


def test_modes_rank_as_the_cache_model_says_and_never_beat_the_oracle() -> None:
    workload = small_bank(sessions=24)
    oracle = oracle_hit_rate(workload.requests, 16, [True] * len(workload.requests))
    figures = {m: simulate(workload, m, _config()).stats.figures() for m in ALL_MODES}
    for mode, f in figures.items():
        assert f["requests"] == len(workload.requests) and f["errors"] == 0, mode
        assert f["hit_rate"] <= oracle + 1e-9, mode
        assert f["hit_rate"] == pytest.approx(f["hbm_hit_rate"] + f["ddr_hit_rate"])
    rr = figures[RoutingMode.ROUND_ROBIN]
    affinity = figures[RoutingMode.AFFINITY]
    affinity_ddr = figures[RoutingMode.AFFINITY_DDR]
    assert rr["hit_rate"] < affinity["hit_rate"] - 0.2
    assert affinity["ddr_hit_rate"] == 0.0
    assert affinity_ddr["hit_rate"] >= affinity["hit_rate"]
    assert affinity_ddr["hit_rate"] == pytest.approx(oracle, abs=0.02)


def test_a_later_turn_is_sent_after_the_previous_answer_plus_think_time() -> None:
    workload = small_bank(sessions=40)
    # One engine for all: answers come late, so later turns leave their nominal schedule.
    result = simulate(workload, RoutingMode.ROUND_ROBIN, _config(engines=1))
    following = workload.next_turns()
    delayed = 0
    for i, request in enumerate(workload.requests):
        after = following[i]
        if request.think_s is None:
            assert result.arrivals[i] == request.arrival
        if after >= 0:
            think = workload.requests[after].think_s
            assert think is not None
            assert result.arrivals[after] == pytest.approx(result.finishes[i] + think)
            delayed += result.arrivals[after] > workload.requests[after].arrival + 1.0
    assert delayed > 0 and sum(1 for j in following if j >= 0) > 20


def _engines_by_session(workload: Workload, assignments: list[int]) -> dict[str, set[int]]:
    engines: dict[str, set[int]] = defaultdict(set)
    for request, engine in zip(workload.requests, assignments, strict=True):
        engines[request.session].add(engine)
    return engines


def test_affinity_keeps_each_session_on_one_engine_and_round_robin_spreads() -> None:
    workload = small_bank(sessions=24)
    config = _config()
    rr = simulate(workload, RoutingMode.ROUND_ROBIN, config)
    assert max(rr.per_engine_requests) - min(rr.per_engine_requests) <= 1  # strict rotation
    assert any(len(e) > 1 for e in _engines_by_session(workload, rr.assignments).values())
    for mode in (RoutingMode.RING_HASH, RoutingMode.AFFINITY, RoutingMode.AFFINITY_DDR):
        result = simulate(workload, mode, config)
        by_session = _engines_by_session(workload, result.assignments)
        assert all(len(e) == 1 for e in by_session.values()), mode
        assert len(set().union(*by_session.values())) >= 3, mode  # sessions spread


def _fail_the_busiest(workload: Workload, fail_at: float) -> tuple[SimResult, int, SimResult]:
    """kvgate with the DDR pool, healthy and with its busiest engine failing at ``fail_at``."""
    healthy = simulate(workload, RoutingMode.AFFINITY_DDR, _config())
    victim = max(range(4), key=lambda i: healthy.per_engine_requests[i])
    failed = simulate(workload, RoutingMode.AFFINITY_DDR,
                      _config(events=[FleetEvent("fail", victim, fail_at)]))
    return healthy, victim, failed


def test_a_failed_engine_gets_no_more_requests_and_its_sessions_move() -> None:
    workload = small_bank(sessions=40, duration_s=400)
    fail_at = 150.0
    before, victim, after = _fail_the_busiest(workload, fail_at)
    moved = set()
    started: dict[str, float] = {}
    for request, b, a, sent in zip(workload.requests, before.assignments, after.assignments,
                                   after.arrivals, strict=True):
        started.setdefault(request.session, sent)
        if sent < fail_at:
            assert a == b
        else:
            assert a not in (victim, -1)
            if b == victim:
                moved.add(request.session)
            elif started[request.session] < fail_at:
                assert a == b  # bound sessions elsewhere stay put
    assert moved
    # the moved sessions find their prefixes in the shared DDR pool
    assert after.stats.figures()["ddr_hit_rate"] > before.stats.figures()["ddr_hit_rate"]


def test_a_failure_breaks_every_unfinished_request_and_its_session_asks_again() -> None:
    workload = small_bank(sessions=300, duration_s=400)
    fail_at = 300.0
    base, victim, failed = _fail_the_busiest(workload, fail_at)
    # Both runs are the same until the failure: these were on the victim, sent, not finished.
    broken = [i for i, e in enumerate(base.assignments)
              if e == victim and base.arrivals[i] < fail_at < base.finishes[i]]
    assert len(broken) >= 2
    assert failed.stats.errors == len(broken)
    following = workload.next_turns()
    for i in broken:
        assert failed.finishes[i] == fail_at
        after = following[i]
        if after >= 0:
            think = workload.requests[after].think_s
            assert think is not None
            assert failed.arrivals[after] == pytest.approx(fail_at + think)


def test_drain_takes_no_new_sessions_but_keeps_its_own() -> None:
    workload = small_bank(sessions=40, duration_s=400)
    drain_at = 100.0
    result = simulate(workload, RoutingMode.AFFINITY,
                      _config(events=[FleetEvent("drain", 0, drain_at)]))
    started: dict[str, float] = {}
    kept = 0
    for request, engine, sent in zip(workload.requests, result.assignments, result.arrivals,
                                     strict=True):
        started.setdefault(request.session, sent)
        if engine == 0 and sent >= drain_at:
            assert started[request.session] < drain_at  # an old session, kept
            kept += 1
    assert kept > 0
    assert sum(1 for t in started.values() if t >= drain_at) > 10


def test_unknown_engine_in_an_event_is_refused() -> None:
    with pytest.raises(ValueError, match="no engine 9"):
        simulate(small_bank(sessions=2), RoutingMode.AFFINITY,
                 _config(events=[FleetEvent("fail", 9, 1)]))


def test_parallel_modes_give_the_same_figures_as_one_process() -> None:
    from simulator.parallel import simulate_modes

    workload = small_bank(sessions=10)
    modes = (RoutingMode.RING_HASH, RoutingMode.AFFINITY_DDR, RoutingMode.ROUND_ROBIN)
    one = simulate_modes(workload, modes, _config(), jobs=1)
    two = simulate_modes(workload, modes, _config(), jobs=2)
    assert list(two) == list(modes)
    for mode in modes:
        assert two[mode][0].figures() == one[mode][0].figures(), mode


def test_send_order_merges_fixed_arrivals_with_turns_due_after_answers() -> None:
    chain_a = [Segment(1, 100), Segment(2, 50)]
    chain_b = [Segment(3, 100)]
    workload = Workload("w", [
        Request(0.0, "a", chain_a, 1, 10),
        Request(5.0, "b", chain_b, 1, 10),
        Request(1.0, "a", chain_a, 2, 10, think_s=3.0),  # a's second turn: 3 s after its answer
    ])
    order = SendOrder(workload)
    assert order.pop() == (0.0, 0)
    assert order.next_due() == 5.0  # a's next turn is not due before a's answer
    order.answered(0, 2.0)
    assert order.next_due() == 5.0  # due at 2 + 3 = 5: the fixed arrival wins the tie
    assert order.pop() == (5.0, 1)
    assert order.pop() == (5.0, 2)
    order.answered(2, 9.0)
    order.answered(1, 8.0)
    assert order.next_due() == NEVER
    assert (order.sent, order.answered_at) == ([0.0, 5.0, 5.0], [2.0, 8.0, 9.0])
