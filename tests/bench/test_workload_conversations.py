"""Trace replay finds conversations from the blocks, whatever the shared prefix's length, per
template family, and never a turn sent before its previous turn could have finished."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from emulator.timing import TimingParams
from kvgate_cli.main import main
from workload.conversations import ConversationIndex, family_templates, shared_prefix_blocks
from workload.trace import earliest_answer, mooncake_trace

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
        {"timestamp": 1000, "input_length": 900, "output_length": 5, "hash_ids": [0, 2],
         "conversation_id": 42},
        # No id: extends alice's prompt, so it continues alice's conversation.
        {"timestamp": 2000, "input_length": 1700, "output_length": 5, "hash_ids": [0, 1, 6, 3]},
        # An id wins over the blocks.
        {"timestamp": 3000, "input_length": 2100, "output_length": 5, "hash_ids": [0, 1, 6, 3, 4],
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
    index = ConversationIndex({0: 1})
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
    assert index.conversations == 4 and index.continuations == 3
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


# Three applications, each with its own template (first block -> template blocks).
FAMILIES = {0: 4, 100: 6, 200: 8}
TICK_MS = 3000  # arrivals on a 3-second grid, as in the tool-agent trace behind issue 42


def _multi_template_trace(path: Path, per_family: int = 10,
                          seed: int = 3) -> tuple[list[str], list[bool]]:
    """Conversations of three template families starting on shared ticks; every other one
    starts holding only its template and a partial block. Each later turn comes a tick or more
    after the previous prompt could have been answered. Returns, per line, the truth and whether
    the request holds nothing beyond its template (then no trace can tell its next turn from
    another conversation's first)."""
    rng = random.Random(seed)
    next_id = 10_000
    rows: list[tuple[int, str, bool, dict[str, object]]] = []
    for first, blocks in FAMILIES.items():
        template = list(range(first, first + blocks))
        for c in range(per_family):
            full, t = list(template), TICK_MS * rng.randint(0, 8)
            for turn in range(rng.randint(1, 4)):
                own = (0 if c % 2 == 0 else rng.randint(1, 3)) if turn == 0 else rng.randint(1, 3)
                ids = full + list(range(next_id, next_id + own + 1))  # the last is partial
                next_id += own + 1
                tokens = 512 * (len(ids) - 1) + 100
                rows.append((t, f"{first}-{c}", len(ids) - 1 == blocks,
                             {"timestamp": t, "input_length": tokens,
                              "output_length": rng.randint(20, 300), "hash_ids": ids}))
                full, next_id = [*ids[:-1], next_id], next_id + 1  # the partial block filled up
                ready_ms = 1000 * earliest_answer(0, tokens)
                t += TICK_MS * (int(ready_ms // TICK_MS) + rng.randint(1, 3))
    rows.sort(key=lambda r: r[0])
    path.write_text("".join(json.dumps(r[3]) + "\n" for r in rows))
    return [r[1] for r in rows], [r[2] for r in rows]


def _same_instant_continuations(arrivals: list[float], sessions: list[str]) -> int:
    latest: dict[str, float] = {}
    same = 0
    for arrival, session in zip(arrivals, sessions, strict=True):
        same += latest.get(session) == arrival
        latest[session] = arrival
    return same


def test_each_template_family_is_read_apart(tmp_path: Path) -> None:
    truth, template_only = _multi_template_trace(tmp_path / "t.jsonl")
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    prompts = [r["hash_ids"] for r in records]
    assert shared_prefix_blocks(prompts) == 0  # the whole trace shares nothing
    assert family_templates(prompts) == FAMILIES
    workload = mooncake_trace(tmp_path / "t.jsonl")
    found = [r.session for r in workload.requests]
    arrivals = [r.arrival for r in workload.requests]
    # The truth, except that a conversation's first turn holding only its template stands
    # alone (its second turn starts the conversation).
    expected = [f"{t}-alone-{i}" if alone else t
                for i, (t, alone) in enumerate(zip(truth, template_only, strict=True))]
    assert any(template_only) and _same_partition(found, expected)
    assert _same_instant_continuations(arrivals, found) == 0
    assert workload.describe["families"] == 3
    assert workload.describe["too_early"] == 0

    # The old rule (the prefix the whole trace shares, no timing) joins a template-only request
    # to every later request of its family, most of them in the same tick.
    whole = ConversationIndex(dict.fromkeys(FAMILIES, shared_prefix_blocks(prompts)))
    old = [whole.assign(ids, name_hint="c") for ids in prompts]
    assert not _same_partition(old, expected)
    assert _same_instant_continuations(arrivals, old) > 5
    assert whole.conversations < len(set(expected))


def test_a_turn_sent_before_the_previous_prompt_could_be_answered_does_not_continue_it() -> None:
    index = ConversationIndex({0: 1})
    assert index.assign([0, 5, 6], name_hint="a", arrival=0.0) == "a"
    index.busy_until("a", 10.0)
    # Extends a's prompt, but a cannot be answered before 10 s.
    assert index.assign([0, 5, 7, 8], name_hint="b", arrival=3.0) == "b"
    index.busy_until("b", 4.0)
    assert index.too_early == 1 and index.continuations == 0
    # Extends b's latest prompt (the longest), then a's: b is answered, so b.
    assert index.assign([0, 5, 7, 9, 4], name_hint="x", arrival=4.0) == "b"
    index.busy_until("b", 30.0)
    # Extends b's latest prompt, busy until 30 s, and a's, answered: the closest answered.
    assert index.assign([0, 5, 7, 9, 11, 12], name_hint="x", arrival=20.0) == "a"
    assert (index.too_early, index.continuations, index.conversations) == (2, 2, 2)
    assert index.held([0, 5, 7, 9, 11, 99]) == 5 and index.held([1, 5]) == 0


def test_earliest_answer_is_the_emulators_prefill_and_the_trace_applies_it(
        tmp_path: Path) -> None:
    # emulator/timing.py defaults: c0 = 20 ms, 5,000 prompt tokens a second.
    assert earliest_answer(10.0, 50_000) == pytest.approx(10.0 + 0.02 + 10.0)
    assert earliest_answer(1.0, -5) == pytest.approx(1.02)
    # The emulator's own prefill, with its defaults (workload cannot import the emulator).
    for tokens in (0, 1, 50_000):
        assert earliest_answer(0.0, tokens) == pytest.approx(
            TimingParams().prefill_seconds(tokens, 0))
    path = tmp_path / "t.jsonl"
    first = list(range(196))  # 100,000 tokens: all but one block uncached, 19.92 s at least
    for gap_ms, sessions in ((10_000, 2), (25_000, 1)):
        path.write_text("".join(json.dumps(r) + "\n" for r in [
            {"timestamp": 0, "input_length": 100_000, "output_length": 5, "hash_ids": first},
            {"timestamp": gap_ms, "input_length": 512 * 196 + 100, "output_length": 5,
             "hash_ids": [*first[:-1], 300, 301]}]))
        workload = mooncake_trace(path)
        assert (workload.describe["sessions"], workload.describe["too_early"]) == (
            sessions, sessions - 1)


def test_a_family_that_is_one_line_is_one_conversation_not_a_template() -> None:
    # No system prompt: each conversation's first block is its own. Its turns all share its
    # first turn's full blocks, which are no template.
    turns = [[7, 8, 9], [7, 8, 10, 11], [7, 8, 10, 12, 13]]
    assert family_templates([*turns, [40, 41]]) == {7: 0, 40: 0}
    index = ConversationIndex(family_templates(turns))
    assert {index.assign(ids, name_hint="c") for ids in turns} == {"c"}
    # Two conversations of one family that diverge past their shared blocks: a template.
    assert family_templates([[7, 8, 9], [7, 8, 20, 21], [7, 8, 9, 22]]) == {7: 2}
