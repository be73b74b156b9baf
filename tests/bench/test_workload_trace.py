from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import write_trace

from workload.bank import BankCodingOptions, bank_coding
from workload.hashing import BlockHasher, PromptBlocks, oracle_hit_rate
from workload.model import Request, Segment
from workload.trace import mooncake_trace


def test_trace_blocks_become_prompts_sharing_exactly_the_traces_blocks(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 5, 6]},
        {"timestamp": 1500, "input_length": 2000, "output_length": 9, "hash_ids": [0, 5, 6, 9]},
        {"timestamp": 2500, "input_length": 600, "output_length": 0, "hash_ids": [0, 8]},
    ]) + "\n")
    workload = mooncake_trace(path)
    a, b, c = workload.requests
    assert [r.prompt_tokens for r in workload.requests] == [1100, 2000, 600]
    assert [r.session for r in workload.requests] == ["mooncake-5", "mooncake-5", "mooncake-8"]
    assert (a.arrival, b.arrival, c.max_tokens) == (0.0, 1.5, 1)
    hasher = BlockHasher(512)
    ha, hb, hc = (hasher.hashes(r) for r in (a, b, c))
    assert ha == hb[:2]  # a's third block is partial (76 tokens): only two full blocks
    assert hc[0] == ha[0] and hc[0:1] == hb[0:1] and len(hc) == 1
    # infinite cache: b reuses a's 2 full blocks, c reuses block 0
    assert oracle_hit_rate(workload.requests, 512, [True] * 3) == pytest.approx(
        (2 * 512 + 512) / 3700)


def test_generated_trace_replays_in_time_order(tmp_path: Path) -> None:
    workload = mooncake_trace(write_trace(tmp_path / "t.jsonl"), limit=10)
    assert len(workload.requests) == 10
    assert [r.arrival for r in workload.requests] == sorted(r.arrival for r in workload.requests)


def test_bad_trace_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                    '{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="line 2"):
        mooncake_trace(path)


def test_answer_blocks_are_the_next_turns_blocks_or_ids_no_prompt_has(tmp_path: Path) -> None:
    chain = [Segment(1, 40), Segment(2, 30), Segment(3, 30), Segment(4, 10)]  # 3: the answer
    bank = [Request(0.0, "s", chain, 2, 30), Request(9.0, "s", chain, 4, 20, think_s=1.0)]
    blocks = PromptBlocks(bank, 16)
    everything = BlockHasher(16).hashes(bank[1])  # 110 tokens: 6 full blocks
    # Turn 1: 70 prompt tokens (4 blocks) + 29 answer tokens = 99 -> blocks 4 and 5.
    assert blocks.answer_hashes(0) == everything[4:6]
    # Turn 2's answer is resent by no later prompt: ids no prompt has, one per block.
    assert [h < 0 for h in blocks.answer_hashes(1)] == [True] * ((110 + 19) // 16 - 6)
    # An infinite cache serves turn 2's prompt and turn 1's answer: 6 blocks of 110 tokens.
    assert oracle_hit_rate(bank, 16, [False, True], blocks) == pytest.approx(96 / 110)
    trace = mooncake_trace(write_trace(tmp_path / "t.jsonl"))
    trace_blocks = PromptBlocks(trace.requests, 512)
    ids = [h for i in range(len(trace.requests)) for h in trace_blocks.answer_hashes(i)]
    assert ids and all(h < 0 for h in ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize("kind", ["bank", "trace"])
def test_the_oracle_is_every_earlier_block_looked_up_in_full(kind: str, tmp_path: Path) -> None:
    # The oracle adds each session's blocks once; a set of every block computed so far, each
    # prompt looked up from its first block, must give the same figure.
    requests = (mooncake_trace(write_trace(tmp_path / "t.jsonl")).requests if kind == "trace"
                else bank_coding(BankCodingOptions(sessions=40, duration_s=900)).requests)
    blocks = PromptBlocks(requests, 16)
    measured = [i % 3 != 0 for i in range(len(requests))]
    seen: set[int] = set()
    hit = total = 0
    for i in range(len(requests)):
        hashes = blocks.hashes(i)
        limit = max(0, blocks.tokens[i] - 1) // 16
        k = next((j for j, h in enumerate(hashes[:limit]) if h not in seen), limit)
        seen.update(hashes, blocks.answer_hashes(i))
        if measured[i]:
            hit, total = hit + 16 * k, total + blocks.tokens[i]
    assert hit > 0
    assert oracle_hit_rate(requests, 16, measured, blocks) == pytest.approx(hit / total)


@pytest.mark.parametrize("kind", ["bank", "trace"])
def test_hashing_in_three_processes_gives_the_same_blocks(kind: str, tmp_path: Path) -> None:
    requests = (mooncake_trace(write_trace(tmp_path / "t.jsonl")).requests if kind == "trace"
                else bank_coding(BankCodingOptions(sessions=40, duration_s=900)).requests)
    alone, shared = PromptBlocks(requests, 16), PromptBlocks(requests, 16, workers=3)
    for i in range(len(requests)):
        assert shared.hashes(i) == alone.hashes(i) and shared.tokens[i] == alone.tokens[i]
        assert shared.answer_hashes(i) == alone.answer_hashes(i)
    # Turns of a session still share one list (the oracle relies on it).
    same = {(i, j) for i in range(len(requests)) for j in range(i)
            if alone.chain(i) is alone.chain(j)}
    assert same or kind == "trace"  # a trace's requests share blocks, not lists
    assert same == {(i, j) for i in range(len(requests)) for j in range(i)
                             if shared.chain(i) is shared.chain(j)}
