"""`kvgate plan --pd`: the prefill:decode splits tried, the TTFT and inter-token goal, and the
smallest fleet and split that meet it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate_cli.main import main
from simulator.pd_plan import best_split, splits
from simulator.plan import Goal

SMALL = ["--sessions", "300", "--duration-s", "600", "--block-size", "16", "--jobs", "1",
         "--context-median-tokens", "3000", "--context-min-tokens", "1000",
         "--context-max-tokens", "8000"]


def test_splits_are_tried_cheapest_first_once_each() -> None:
    # 0.25 and 0.5 of 8 and 12 engines; of 4, 0.25 rounds to 1.
    assert splits([12, 8, 4]) == [(1, 3), (2, 2), (2, 6), (4, 4), (3, 9), (6, 6)]
    # Rounding keeps one engine on each side; a share rounding twice to one split counts once.
    assert splits([2], [0.1, 0.9]) == [(1, 1)]
    assert splits([8], [0.3, 0.25]) == [(2, 6)]
    assert splits([10], [0.25]) == [(3, 7)]  # halves round up
    assert splits([8, 4], explicit=[(5, 3), (1, 3), (5, 3)]) == [(1, 3), (5, 3)]


def test_a_split_that_cannot_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="--splits 3:4 is 7 engines, not one of --engines 8"):
        splits([8], explicit=[(3, 4)])
    with pytest.raises(ValueError, match="--engines 12: no split of it in --splits"):
        splits([8, 12], explicit=[(2, 6)])
    with pytest.raises(ValueError, match="a P/D fleet needs at least 2 engines"):
        splits([1, 4])


def test_the_inter_token_goal_and_the_split_with_the_most_headroom() -> None:
    goal = Goal(ttft_p99_s=10.0, itl_p99_s=0.1)
    good = {"errors": 0, "ttft_p99_s": 9.0, "hit_rate": 0.6, "itl_p99_s": 0.05}
    assert goal.met_by(good)
    assert not goal.met_by({**good, "itl_p99_s": 0.2})
    assert not goal.met_by({**good, "itl_p99_s": None})  # no figure: not met
    assert Goal(10.0).met_by({**good, "itl_p99_s": 0.2})  # no inter-token goal
    assert goal.strain(good) == pytest.approx(0.9)
    assert goal.describe() == "TTFT p99 <= 10 s and ITL p99 <= 100 ms"
    assert "itl_p99_s" not in Goal(10.0).document()  # colocated plans' JSON as before
    rows = [{"engines": 4, "meets_goal": False, "ttft_p99_s": 1.0, "itl_p99_s": 0.01},
            {"engines": 8, "meets_goal": True, "ttft_p99_s": 9.0, "itl_p99_s": 0.02},
            {"engines": 8, "meets_goal": True, "ttft_p99_s": 5.0, "itl_p99_s": 0.06},
            {"engines": 12, "meets_goal": True, "ttft_p99_s": 1.0, "itl_p99_s": 0.01}]
    assert best_split(rows, goal) == rows[2]  # 0.6 of both goals beats 0.9 of the TTFT one
    assert best_split(rows[:1], goal) is None


def test_plan_pd_tries_each_split_and_answers_the_smallest_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--pd", "--engines", "4,2", *SMALL, "--ttft-p99", "10",
                 "--itl-p99", "0.1", "--out", str(tmp_path)])
    document = json.loads((tmp_path / "plan-pd-bank-coding.json").read_text())
    rows = document["fleets"]
    assert document["mode"] == "pd-kvgate"
    assert [(r["prefill_engines"], r["decode_engines"]) for r in rows] == [(1, 1), (1, 3), (2, 2)]
    for r in rows:
        assert r["meets_goal"] == (r["errors"] == 0 and r["ttft_p99_s"] <= 10
                                   and r["itl_p99_s"] <= 0.1)
        assert 0 <= r["prefill_skipped_share"] <= 1
    # One decode engine streams beside its own prefills of skipped turns: a longer ITL tail.
    assert rows[0]["itl_p99_s"] > rows[1]["itl_p99_s"]
    best = document["cheapest"]
    assert code == (0 if best is not None else 1)
    assert best is not None and best["engines"] == min(r["engines"] for r in rows
                                                       if r["meets_goal"])
    out = capsys.readouterr().out
    assert (f"in mode pd-kvgate: {best['engines']} engines, {best['prefill_engines']} prefill : "
            f"{best['decode_engines']} decode") in out
    table = (tmp_path / "plan-pd-bank-coding.md").read_text()
    assert table.count("\n| ") == 4 and "| prefill skipped |" in table  # header + 3


def test_colocated_plans_show_itl_only_with_an_inter_token_goal(tmp_path: Path) -> None:
    main(["plan", "--engines", "2", *SMALL, "--itl-p99", "10", "--out", str(tmp_path)])
    document = json.loads((tmp_path / "plan-bank-coding.json").read_text())
    assert document["goal"]["itl_p99_s"] == 10
    assert "| ITL p99 |" in (tmp_path / "plan-bank-coding.md").read_text()
    main(["plan", "--engines", "2", *SMALL, "--out", str(tmp_path)])
    assert "ITL" not in (tmp_path / "plan-bank-coding.md").read_text()


@pytest.mark.parametrize(("flags", "message"), [
    (["--pd", "--engines", "8", "--mode", "affinity+ddr"], "--pd plans a P/D mode"),
    (["--engines", "8", "--mode", "pd-llm-d"], "mode pd-llm-d needs --pd"),
    (["--engines", "8", "--splits", "2:6"], "--splits needs --pd"),
    (["--engines", "8", "--prefill-shares", "0.5"], "--prefill-shares needs --pd"),
    (["--pd", "--engines", "8", "--splits", "3:4"], "--splits 3:4 is 7 engines"),
    (["--pd", "--engines", "1,8"], "a P/D fleet needs at least 2 engines"),
    (["--pd", "--engines", "8", "--prefill-shares", "1"], "--prefill-shares must each be in"),
    (["--pd", "--engines", "8", "--prefill-shares", "0.5", "--splits", "4:4"], "not both"),
    (["--pd", "--engines", "8", "--ddr-tokens", "100000,200000"], "one --ddr-tokens value"),
    (["--pd", "--engines", "8", "--skip-prefill-below", "-1"], "--skip-prefill-below must"),
    (["--engines", "8", "--itl-p99", "0"], "--itl-p99 must be > 0"),
])
def test_bad_pd_input_is_named_before_anything_runs(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvgate plan: ") and message in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--splits", "0:8"], "expected P:D, two counts >= 1"),
    (["--mode", "pd-nope"], "unknown mode 'pd-nope'"),
])
def test_malformed_pd_flags_are_argument_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--pd", "--engines", "8", *flags])
    assert message in capsys.readouterr().err
