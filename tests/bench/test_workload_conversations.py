"""Trace replay finds conversations from the blocks, whatever the shared prefix's length."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from kvgate_cli.main import main
from workload.conversations import ConversationIndex, shared_prefix_blocks
from workload.trace import mooncake_trace

SHARED = 40  # blocks every request starts with: a system prompt plus tool schemas


def _synthetic_trace(path: Path, conversations: int = 30, seed: int = 1) -> dict[int, str]:
    """Conversations over a 40-block shared prefix, turns interleaved in time. Each turn resends
    the previous prompt's full blocks; the previous last block was partial, so it comes back
    under a new id (it filled up) followed by new blocks. A first prompt has at least one full
    block of its own (with none, no trace could tell its next turn from another conversation).
    Returns line number -> truth."""
    rng = random.Random(seed)
    next_id = 1000
    records = []
    for c in range(conversations):
        full: list[int] = list(range(SHARED))
        t = rng.uniform(0, 600_000)
        for turn in range(rng.randint(1, 6)):
            new = [next_id + i for i in range(rng.randint(2 if turn == 0 else 1, 4))]
            next_id += len(new)
            ids = full + new  # new[-1] is this turn's partial last block
            records.append((t, c, {"timestamp": round(t), "output_length": 50, "hash_ids": ids,
                                   "input_length": 512 * (len(ids) - 1) + rng.randint(1, 511)}))
            full = [*ids[:-1], next_id]  # the partial block, filled up, is another block
            next_id += 1
            t += rng.uniform(10_000, 200_000)
    records.sort(key=lambda r: r[0])
    path.write_text("".join(json.dumps(r) + "\n" for _, _, r in records))
    return {line: f"truth-{c}" for line, (_, c, _) in enumerate(records, 1)}


def _same_partition(found: list[str], truth: list[str]) -> bool:
    pairs = set(zip(found, truth, strict=True))
    return len(pairs) == len(set(found)) == len(set(truth))


def test_a_40_block_shared_prefix_is_not_one_session(tmp_path: Path) -> None:
    truth = _synthetic_trace(tmp_path / "t.jsonl")
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    # What `hash_ids[1]` took for a session id is the same block in every request here.
    assert len({r["hash_ids"][1] for r in records}) == 1
    workload = mooncake_trace(tmp_path / "t.jsonl")
    assert workload.describe["shared_prefix_blocks"] == SHARED
    assert workload.describe["sessions_from"] == "inferred"
    found = [r.session for r in workload.requests]
    assert _same_partition(found, [truth[line] for line in range(1, len(records) + 1)])
    assert workload.describe["sessions"] == len(set(truth.values())) == 30


def test_record_ids_are_used_when_present_and_gz_files_are_read(tmp_path: Path) -> None:
    records = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 5],
         "session_id": "alice"},
        {"timestamp": 1, "input_length": 900, "output_length": 5, "hash_ids": [0, 2],
         "conversation_id": 42},
        # No id: extends alice's prompt, so it continues alice's conversation.
        {"timestamp": 2, "input_length": 1700, "output_length": 5, "hash_ids": [0, 1, 6, 3]},
        # An id wins over the blocks.
        {"timestamp": 3, "input_length": 2100, "output_length": 5, "hash_ids": [0, 1, 6, 3, 4],
         "session_id": "bob"},
    ]
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    workload = mooncake_trace(path)
    assert [r.session for r in workload.requests] == ["alice", "42", "alice", "bob"]
    assert workload.describe["sessions_from"] == "record ids + inferred"


def test_bad_session_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1],'
                    ' "session_id": {"a": 1}}\n')
    with pytest.raises(ValueError, match="line 1: session_id/conversation_id must be"):
        mooncake_trace(path)


def test_continues_the_closest_conversation_and_not_a_shared_subset() -> None:
    index = ConversationIndex(shared_blocks=1)
    app = [0, 7, 8, 9]  # one app's own three-block prompt, after the global one
    assert index.assign([*app, 10, 11], name_hint="a") == "a"
    # Another conversation of the same app shares blocks beyond the global prefix, but does
    # not contain a's prompt: a new conversation.
    assert index.assign([*app, 20, 21], name_hint="b") == "b"
    assert index.assign([*app, 10, 12, 13], name_hint="x") == "a"  # a's turn 2 (11 filled up)
    # A turn extending b's latest prompt, and one extending a's.
    assert index.assign([*app, 20, 22, 23], name_hint="x") == "b"
    assert index.assign([*app, 10, 12, 14, 15], name_hint="x") == "a"
    # Only the global prefix plus a partial block: nothing to go by.
    assert index.assign([0, 7], name_hint="c") == "c"
    assert index.assign([0, 7, 30], name_hint="c") == "c-2"
    assert index.conversations == 4
    assert shared_prefix_blocks([[0, 1, 2], [0, 1, 3], [0, 1]]) == 2
    assert shared_prefix_blocks([[5, 1], [6, 1]]) == 0 and shared_prefix_blocks([]) == 0


def test_profile_reports_the_sessions_inferred(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _synthetic_trace(tmp_path / "t.jsonl")
    assert main(["profile", "--trace", str(tmp_path / "t.jsonl"), "--sessions", "10",
                 "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "| sessions | 30 (inferred) | 10 |" in out
    document = json.loads((tmp_path / "p.json").read_text())
    assert document["trace t.jsonl"]["sessions_from"] == "inferred"
    assert document["trace t.jsonl"]["extends_previous"] == 1.0
