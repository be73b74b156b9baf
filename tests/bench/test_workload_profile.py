from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate_cli.main import main
from workload.bank import BankCodingOptions, bank_coding
from workload.profile import Spread, profile
from workload.trace import mooncake_trace


def _trace(path: Path) -> Path:
    records = [
        # session 5: three turns, the third does not start with the second's blocks (the
        # record's id says it is the same session all the same)
        {"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 5, 6],
         "session_id": "s5"},
        {"timestamp": 10_000, "input_length": 1600, "output_length": 9, "hash_ids": [0, 5, 6, 7],
         "session_id": "s5"},
        {"timestamp": 40_000, "input_length": 1200, "output_length": 11, "hash_ids": [0, 5, 8, 9],
         "session_id": "s5"},
        # session 3: one turn
        {"timestamp": 5_000, "input_length": 700, "output_length": 3, "hash_ids": [0, 3],
         "session_id": "s3"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_trace_profile_counts_sessions_turns_gaps_and_the_shared_block(tmp_path: Path) -> None:
    p = profile(mooncake_trace(_trace(tmp_path / "t.jsonl")))
    assert (p.requests, p.sessions, p.span_s) == (4, 2, 40.0)
    # only block 0 is in every request: the shared prefix is 512 tokens or more, under 1,024
    assert (p.shared_prefix_tokens, p.shared_prefix_resolution) == (512, 512)
    assert p.turns.largest == 3 and p.turns.mean == 2.0
    assert (p.gap_s.mean, p.gap_s.largest) == (20.0, 30.0)  # 10 s, then 30 s
    assert p.growth_tokens.mean == pytest.approx((500 - 400) / 2)
    assert p.extends_previous == 0.5
    assert p.first_prompt_tokens.mean == pytest.approx((1100 + 700) / 2)
    assert p.answer_tokens.largest == 11


def test_a_trace_whose_shortest_prompt_is_the_shared_block_shares_exactly_it(
        tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 1, "input_length": 900, "output_length": 1, "hash_ids": [0, 4]}\n')
    p = profile(mooncake_trace(path))
    assert (p.shared_prefix_tokens, p.shared_prefix_resolution) == (512, 1)


def test_bank_coding_shares_exactly_its_system_prompt_and_every_turn_extends() -> None:
    options = BankCodingOptions(sessions=60, system_tokens=900, seed=3)
    workload = bank_coding(options)
    p = profile(workload)
    assert (p.shared_prefix_tokens, p.shared_prefix_resolution) == (900, 1)
    assert p.sessions == len({r.session for r in workload.requests})
    assert p.requests == len(workload.requests)
    assert p.extends_previous == 1.0
    assert p.growth_tokens.p10 > 0  # every turn adds an answer and a question
    assert p.turns.mean == pytest.approx(p.requests / p.sessions)


def test_spread_of_nothing_or_one_value() -> None:
    assert Spread.of([]) == Spread()
    assert Spread.of([4]) == Spread(4.0, 4.0, 4.0, 4.0, 4.0)


def test_profile_command_puts_the_trace_beside_bank_coding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "profile.json"
    code = main(["profile", "--trace", str(_trace(tmp_path / "t.jsonl")), "--sessions", "30",
                 "--system-tokens", "700", "--json", str(out)])
    table = capsys.readouterr().out
    assert code == 0
    assert "| shape | trace t.jsonl | bank-coding (these flags) |" in table
    assert "| shared prefix (every request), tokens | 512 to 1,023 | 700 |" in table
    document = json.loads(out.read_text())
    assert document["bank-coding (these flags)"]["sessions"] == 30
    assert document["trace t.jsonl"]["turns"]["largest"] == 3


def test_profile_command_names_a_bad_trace_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                   "not json\n")
    assert main(["profile", "--trace", str(bad)]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err


def test_profile_command_says_when_it_cannot_write_the_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["profile", "--sessions", "5", "--json", str(blocker / "p.json")]) == 2
    assert f"--json {blocker / 'p.json'}:" in capsys.readouterr().err
