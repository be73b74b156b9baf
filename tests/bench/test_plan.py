"""`kvgate plan`: fleets tried cheapest first, the goal, and the smallest fleet that meets it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate_cli.main import main
from simulator.plan import Fleet, Goal, cheapest, fleets

SMALL = ["--sessions", "300", "--duration-s", "600", "--block-size", "16", "--jobs", "2",
         "--context-median-tokens", "3000", "--context-min-tokens", "1000",
         "--context-max-tokens", "8000"]


def test_fleets_are_tried_cheapest_first_once_each() -> None:
    assert fleets([16, 8, 8], None) == [Fleet(8, None), Fleet(16, None)]
    assert fleets([2, 1], [500, 100, 500]) == [Fleet(1, 100), Fleet(1, 500), Fleet(2, 100),
                                                Fleet(2, 500)]
    assert fleets([1], [100], [144.0, 40.0]) == [Fleet(1, 100, 40.0), Fleet(1, 100, 144.0)]


def test_the_goal_needs_no_errors_a_short_tail_and_enough_hits() -> None:
    goal = Goal(ttft_p99_s=10.0, min_hit_rate=0.5)
    good = {"errors": 0, "ttft_p99_s": 9.0, "hit_rate": 0.6}
    assert goal.met_by(good)
    assert not goal.met_by({**good, "errors": 1})
    assert not goal.met_by({**good, "ttft_p99_s": 10.5})
    assert not goal.met_by({**good, "hit_rate": 0.4})
    rows = [{"engines": 1, "meets_goal": False}, {"engines": 2, "meets_goal": True},
            {"engines": 3, "meets_goal": True}]
    assert cheapest(rows) == rows[1] and cheapest(rows[:1]) is None


def test_plan_finds_the_smallest_fleet_and_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--engines", "4,1,2", *SMALL, "--ttft-p99", "3",
                 "--out", str(tmp_path)])
    document = json.loads((tmp_path / "plan-bank-coding.json").read_text())
    rows = document["fleets"]
    assert [r["engines"] for r in rows] == [1, 2, 4]
    assert all(r["meets_goal"] == (r["errors"] == 0 and r["ttft_p99_s"] <= 3) for r in rows)
    # One engine for 300 sessions queues; more engines shorten the tail.
    assert rows[0]["ttft_p99_s"] > rows[-1]["ttft_p99_s"]
    best = document["cheapest"]
    assert code == (0 if best is not None else 1)
    assert best is not None and not rows[0]["meets_goal"]
    assert best == next(r for r in rows if r["meets_goal"])
    out = capsys.readouterr().out
    assert f"smallest fleet meeting TTFT p99 <= 3 s in mode affinity+ddr: {best['engines']} " \
           "engines" in out
    assert (tmp_path / "plan-bank-coding.md").read_text().count("\n| ") == 4  # header + 3


def test_plan_tries_pool_bandwidths_and_reports_the_pool_traffic(tmp_path: Path) -> None:
    main(["plan", "--engines", "2", *SMALL, "--mode", "round_robin+ddr", "--node-gbps", "1,144",
          "--ttft-p99", "1000", "--out", str(tmp_path)])
    document = json.loads((tmp_path / "plan-bank-coding.json").read_text())
    narrow, wide = document["fleets"]
    assert (narrow["node_gbps"], wide["node_gbps"]) == (1.0, 144.0)
    assert narrow["ttft_p99_s"] > wide["ttft_p99_s"]  # a narrow link makes transfers wait
    assert wide["pool_read_gbps_peak"] > narrow["pool_read_gbps_peak"] > 0
    assert "node link 1 GB/s" in (tmp_path / "plan-bank-coding.md").read_text()


def test_no_fleet_meeting_the_goal_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--engines", "1,2", *SMALL, "--mode", "round_robin",
                 "--ttft-p99", "0.001"])
    assert code == 1
    assert "no fleet tried meets TTFT p99 <= 0.001 s in mode round_robin" in (
        capsys.readouterr().out)


@pytest.mark.parametrize(("flags", "message"), [
    (["--engines", "0,4"], "--engines must be >= 1"),
    (["--engines", "4", "--ddr-tokens", "-5"], "--ddr-tokens"),
    (["--engines", "4", "--ttft-p99", "0"], "--ttft-p99 must be > 0"),
    (["--engines", "4", "--min-hit-rate", "1.5"], "--min-hit-rate must be in [0, 1]"),
    (["--engines", "4", "--sessions", "-1"], "--sessions must be >= 0"),
])
def test_bad_input_is_named_before_anything_runs(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvgate plan: ") and message in err


def test_engines_must_be_integers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--engines", "eight"])
    assert "expected comma-separated integers" in capsys.readouterr().err
