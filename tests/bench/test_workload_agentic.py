"""`agentic-coding`: a long shared harness prefix, sessions growing to 60-150k, seconds apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate_cli.main import main
from workload.agentic import AgenticCodingOptions, agentic_coding
from workload.model import Request, Segment
from workload.profile import peak_working_set, profile


def test_sessions_share_the_harness_and_grow_to_their_target_seconds_apart() -> None:
    options = AgenticCodingOptions(sessions=60, duration_s=36_000, ramp_s=0)
    workload = agentic_coding(options)
    shape = profile(workload)
    assert shape.shared_prefix_tokens == options.prefix_tokens == 15_000
    assert shape.extends_previous == 1.0  # every turn extends the previous prompt
    assert 1 <= shape.gap_s.p50 <= 30  # seconds, not minutes
    last: dict[str, Request] = {}
    for r in workload.requests:
        last[r.session] = r
    finals = [r.prompt_tokens for r in last.values()]
    # A session stops once its context passes its target, drawn from 60k..150k.
    assert min(finals) >= 0.6 * options.target_min_tokens
    assert max(finals) <= options.target_max_tokens
    assert sorted(finals)[len(finals) // 2] >= 50_000
    assert agentic_coding(options).requests == workload.requests  # deterministic


def test_bad_options_name_their_flag() -> None:
    with pytest.raises(ValueError, match="--agent-target-min-tokens"):
        agentic_coding(AgenticCodingOptions(target_min_tokens=200_000))


def test_peak_working_set_counts_sessions_in_progress_and_the_shared_prefix_once() -> None:
    chain = [Segment(1, 100), Segment(2, 50), Segment(3, 50)]
    other = [Segment(1, 100), Segment(4, 30)]
    requests = [Request(0.0, "a", chain, 2, 8), Request(10.0, "a", chain, 3, 8),
                Request(5.0, "b", other, 2, 8), Request(20.0, "c", other, 2, 8)]
    # a (100 beyond the prefix) and b (30) overlap at t=5..10; c starts after both ended.
    assert peak_working_set(requests, shared=100) == 100 + 100 + 30


def test_profile_shows_agentic_coding_beside_bank_coding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.json"
    assert main(["profile", "--workload", "agentic-coding", "--sessions", "20",
                 "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| shape | agentic-coding | bank-coding |" in table
    assert "peak working set" in table
    document = json.loads(out.read_text())
    assert document["agentic-coding"]["sessions"] == 20
    assert document["bank-coding"]["sessions"] == 3200  # bank-coding at its own default
