from __future__ import annotations

import math

import pytest

from benchkit.report import ModeStats
from simulator.run import SimResult
from simulator.small_fleet import SCENARIO, arrival_cv, main


def _result(assignments: list[int], arrivals: list[float]) -> SimResult:
    return SimResult(ModeStats(), assignments=assignments, arrivals=arrivals)


def test_turn_taking_over_even_arrivals_has_no_variation() -> None:
    # Round robin over requests 1 s apart: each of 2 engines gets one every 2 s.
    assert arrival_cv(_result([0, 1] * 5, [float(t) for t in range(10)]), 2) == 0.0


def test_uneven_gaps_and_unrouted_requests() -> None:
    # Engine 0: gaps 1 and 3 (mean 2, deviation 1): 0.5; the unrouted request is left out.
    result = _result([0, 0, -1, 0], [0.0, 1.0, 2.0, 4.0])
    assert arrival_cv(result, 1) == pytest.approx(0.5)
    assert math.isnan(arrival_cv(_result([0], [0.0]), 1))  # no gaps to measure


def test_the_scenario_runs_each_mode_for_each_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--agent-prefix-tokens" in SCENARIO and "5" in SCENARIO
    # Later flags override the scenario's: a tiny fleet and load, so the test is quick.
    code = main(["--seeds", "0,1", "--engines", "2", "--sessions", "6", "--duration-s", "300",
                 "--ramp-s", "60", "--agent-target-max-tokens", "40000"])
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert [row.split(" | ")[1] for row in rows] == ["round_robin+ddr", "affinity+ddr"] * 2
    for row in rows:
        p50, p90, p99 = (float(cell.removesuffix(" s")) for cell in row.split(" | ")[2:5])
        assert 0 < p50 <= p90 <= p99
