"""A trace's hash_ids must fit its block size: 512 tokens (Mooncake) unless
--trace-block-tokens says otherwise (Alibaba's Qwen/Bailian traces use 16)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_helpers import write_trace

from kvgate_cli.main import main
from workload.hashing import oracle_hit_rate
from workload.trace import mooncake_trace


def _split(source: Path, target: Path, tokens: int = 16) -> Path:
    """The same trace with ``tokens``-token blocks: each 512-token block b becomes 512 / tokens
    blocks keyed by b, its partial last block as many as its tokens need."""
    per = 512 // tokens
    lines = []
    for line in source.read_text().splitlines():
        record = json.loads(line)
        left, ids = record["input_length"], []
        for b in record["hash_ids"]:
            count = min(per, math.ceil(left / tokens))
            ids += [b * per + j for j in range(count)]
            left -= tokens * count
        lines.append(json.dumps({**record, "hash_ids": ids}) + "\n")
    target.write_text("".join(lines))
    return target


def test_a_16_token_trace_reads_like_its_512_token_original(tmp_path: Path) -> None:
    original = write_trace(tmp_path / "512.jsonl", conversations=20, turns=4)
    split = _split(original, tmp_path / "16.jsonl")
    big, small = mooncake_trace(original), mooncake_trace(split, block_tokens=16)
    assert small.describe["block_tokens"] == 16
    assert [r.prompt_tokens for r in small.requests] == [r.prompt_tokens for r in big.requests]
    # The 20 conversations written. At 512 tokens a first turn of one block and a partial one
    # holds nothing beyond the shared block, so its next turn cannot be told to continue it;
    # at 16 its own full blocks tell. Otherwise the same conversations.
    pairs = {(a.session, b.session) for a, b in zip(big.requests, small.requests, strict=True)}
    assert len({b for _, b in pairs}) == 20 < len({a for a, _ in pairs}) == len(pairs)
    # The same reuse: both share exactly the same tokens.
    measured = [True] * len(big.requests)
    reuse = oracle_hit_rate(big.requests, 16, measured)
    assert reuse > 0.4
    assert oracle_hit_rate(small.requests, 16, measured) == pytest.approx(reuse)


def test_ids_that_do_not_fit_the_block_size_are_refused(tmp_path: Path) -> None:
    original = write_trace(tmp_path / "512.jsonl")
    split = _split(original, tmp_path / "16.jsonl")
    with pytest.raises(ValueError, match=r"16\.jsonl: line 1: ") as info:
        mooncake_trace(split)
    message = str(info.value)
    assert "do not fit 512-token blocks" in message and "\n" not in message
    assert message.endswith("--trace-block-tokens 16")
    with pytest.raises(ValueError, match=r"do not fit 16-token blocks .* --trace-block-tokens 512"):
        mooncake_trace(original, block_tokens=16)
    # One id more or less than ceil(input_length / block) is read (a partial block dropped).
    path = tmp_path / "slack.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 1100, "output_length": 1,
                                "hash_ids": [0, 1]}) + "\n")
    assert mooncake_trace(path).requests[0].prompt_tokens == 1100
    # No power of two fits: the line says how many tokens an id covers.
    path.write_text(json.dumps({"timestamp": 0, "input_length": 5000, "output_length": 1,
                                "hash_ids": list(range(200))}) + "\n")
    with pytest.raises(ValueError, match=r"\(those make 10\); about 25 tokens an id$"):
        mooncake_trace(path)


@pytest.mark.parametrize("command", [["simulate"], ["plan", "--engines", "4"],
                                     ["bench", "--compare"],
                                     ["profile"]])
def test_every_trace_command_takes_the_block_size(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    split = _split(write_trace(tmp_path / "512.jsonl"), tmp_path / "16.jsonl")
    assert main([*command, "--trace", str(split)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "do not fit 512-token blocks" in err[-1] and "--trace-block-tokens 16" in err[-1]
    assert main([*command, "--trace", str(split), "--trace-block-tokens", "0"]) == 2
    assert "--trace-block-tokens must be >= 1" in capsys.readouterr().err


def test_profile_reads_a_16_token_trace(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    split = _split(write_trace(tmp_path / "512.jsonl"), tmp_path / "16.jsonl")
    assert main(["profile", "--trace", str(split), "--trace-block-tokens", "16",
                 "--json", str(tmp_path / "p.json")]) == 0
    document = json.loads((tmp_path / "p.json").read_text())
    assert document["trace 16.jsonl"]["sessions"] == 8
    assert document["trace 16.jsonl"]["shared_prefix_resolution"] == 16
    assert "| sessions | 8 (inferred)" in capsys.readouterr().out
