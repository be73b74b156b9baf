from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import write_trace

from kvgate_cli.main import main


def test_simulate_writes_the_three_outputs_for_every_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--engines", "3", "--sessions", "30", "--duration-s", "600",
                 "--block-size", "16", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    document = json.loads((tmp_path / "simulate-bank-coding.json").read_text())
    assert list(document["modes"]) == ["round_robin", "ring_hash", "affinity", "round_robin+ddr",
                                       "affinity+ddr", "sticky+ddr", "prefix-score", "kv-cost",
                                       "bounded-hash"]
    assert document["workload"]["sessions"] == 30 and document["workload"]["engines"] == 3
    bound = [document[f"no_queue_ttft_p{p}_s"] for p in (50, 90, 99)]
    assert 0 < bound[0] <= bound[1] <= bound[2]
    for figures in document["modes"].values():  # nobody beats an idle engine holding it all
        assert figures["ttft_p99_s"] >= bound[2] - 1e-9
    for mode in ("round_robin+ddr", "affinity+ddr"):  # what the pool cost, in every result
        figures = document["modes"][mode]
        assert figures["ddr_bytes_per_request_mean"] > 0
        assert figures["ddr_bytes_per_request_p99"] >= figures["ddr_bytes_per_request_mean"]
        assert figures["pool_read_gbps_peak"] >= figures["pool_read_gbps_mean"] > 0
        assert 0 <= figures["node_link_utilisation_p99"] <= 1
    assert 0 < document["oracle_hit_rate"] <= 1
    assert (tmp_path / "simulate-bank-coding.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "| affinity+ddr |" in out and "What the DDR pool costs" in out
    assert "no-queue bound" in out


def test_simulate_replays_a_trace_with_failure_and_drain(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", conversations=20)
    code = main(["simulate", "--trace", str(trace), "--engines", "4", "--modes", "affinity+ddr",
                 "--fail", "1@10", "--drain", "2@5", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    document = json.loads((tmp_path / "simulate-mooncake-trace.json").read_text())
    assert document["workload"]["fail"] == [{"engine": 1, "time": 10.0}]
    assert document["modes"]["affinity+ddr"]["requests"] > 0


def test_the_pool_connector_is_chosen_by_name_and_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--engines", "2", "--sessions", "20", "--duration-s", "300",
                 "--modes", "affinity+ddr", "--pool-connector", "mooncake", "--out",
                 str(tmp_path), "--quiet", "--no-oracle", "--pool-residency", "on"])
    assert code == 0
    workload = json.loads((tmp_path / "simulate-bank-coding.json").read_text())["workload"]
    assert workload["pool_connector"] == "mooncake"
    assert workload["pool_residency"] is True
    assert workload["pool_profile"]["eviction"] == "lease"
    assert workload["pool_watermarks"] == [0.9, 0.9]  # the connector's, none given
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--pool-connector", "memcache"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--pool-connector" in err and "ascend-store" in err and "memcache" in err


def test_bad_event_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--fail", "one@two"])
    assert "ENGINE@T" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["simulate", "bench", "plan"])
def test_help_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "--warmup" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "message"), [
    (["--engines", "0"], "--engines must be >= 1"),
    (["--fail", "99@10"], "--fail 99@10: no engine 99 (engines are 0..15)"),
    (["--drain", "1@-5"], "--drain 1@-5: time must be >= 0"),
    (["--sessions", "-5"], "--sessions must be >= 0"),
    (["--ramp-start", "0", "--turns-mean", "0"],
     "--ramp-start must be in (0, 1]; --turns-mean must be >= 1"),
    (["--load-factor", "0.5"], "--load-factor must be >= 1"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--trace", "/nonexistent/trace.jsonl"], "trace /nonexistent/trace.jsonl: No such file"),
    (["--trace", "{readme}"], "README.md: line 1: not JSON"),
    (["--trace", "/dev/null"], "trace /dev/null: no requests"),
    (["--out", "/proc/kvgate-results"], "--out /proc/kvgate-results: "),
])
def test_bad_input_says_what_and_where_before_running(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = str(Path(__file__).parents[2] / "README.md")
    code = main(["simulate", "--quiet", *(f.format(readme=readme) for f in flags)])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert "workload" not in err  # refused before the workload was built
