from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import write_trace

from kvgate.cli import main


def test_simulate_writes_the_three_outputs_for_every_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--engines", "3", "--sessions", "30", "--duration-s", "600",
                 "--block-size", "16", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    document = json.loads((tmp_path / "simulate-bank-coding.json").read_text())
    assert list(document["modes"]) == ["round_robin", "ring_hash", "affinity", "affinity+ddr"]
    assert document["workload"]["sessions"] == 30 and document["workload"]["engines"] == 3
    assert 0 < document["oracle_hit_rate"] <= 1
    assert (tmp_path / "simulate-bank-coding.png").stat().st_size > 10_000
    assert "| affinity+ddr |" in capsys.readouterr().out


def test_simulate_replays_a_trace_with_failure_and_drain(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", conversations=20)
    code = main(["simulate", "--trace", str(trace), "--engines", "4", "--modes", "affinity+ddr",
                 "--fail", "1@10", "--drain", "2@5", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    document = json.loads((tmp_path / "simulate-mooncake-trace.json").read_text())
    assert document["workload"]["fail"] == [{"engine": 1, "time": 10.0}]
    assert document["modes"]["affinity+ddr"]["requests"] > 0


def test_bad_event_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--fail", "one@two"])
    assert "ENGINE@T" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["simulate", "bench"])
def test_help_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "--warmup" in capsys.readouterr().out
