"""HBM residency from KV cache events (pure): a session's leading resident run, its shared
prefix, evictions from the tail and in the middle, re-stores, clears and gaps."""

from __future__ import annotations

from typing import Any

from kvgate.fleet.residency import EngineResidency

BS = 16


def stored(blocks: list[int], parent: int | None, session: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": blocks,
                             "parent_block_hash": parent, "token_ids": [0] * BS * len(blocks),
                             "block_size": BS}
    if session is not None:
        event["session_id"] = session
    return event


def removed(*blocks: int) -> list[dict[str, Any]]:
    return [{"type": "BlockRemoved", "block_hashes": [b], "medium": "GPU"} for b in blocks]


def test_a_session_holds_what_it_stored_until_its_tail_is_evicted() -> None:
    hbm = EngineResidency()
    assert hbm.hbm_tokens("s") is None  # nothing known of it here
    hbm.apply([stored([1, 2, 3], None, "s")])  # turn 1: three full blocks
    assert hbm.hbm_tokens("s") == 3 * BS
    hbm.apply([stored([4], 3, "s"), stored([5], 4, "s")])  # turn 2: prompt, then an answer block
    assert hbm.hbm_tokens("s") == 5 * BS
    hbm.apply(removed(5, 4))  # freed tail first, evicted in that order
    assert hbm.hbm_tokens("s") == 3 * BS
    hbm.apply(removed(3, 2, 1))
    assert hbm.hbm_tokens("s") == 0  # known to hold nothing: not the same as unknown


def test_what_a_session_stored_stays_its_depth_as_its_blocks_leave() -> None:
    """`stored_tokens`: the depth of its last own block, resident or not; with `hbm_tokens`,
    the share still held (kvgate.placement.signals.held_context)."""
    hbm = EngineResidency()
    assert hbm.stored_tokens("s") is None
    hbm.apply([stored([1, 2, 3], None, "s"), stored([4], 3, "s")])  # prompt, answer block
    assert (hbm.hbm_tokens("s"), hbm.stored_tokens("s")) == (4 * BS, 4 * BS)
    hbm.apply(removed(4, 3))
    assert (hbm.hbm_tokens("s"), hbm.stored_tokens("s")) == (2 * BS, 4 * BS)
    hbm.apply([stored([30, 31], 2, "s")])  # the next turn went another way after block 2
    assert (hbm.hbm_tokens("s"), hbm.stored_tokens("s")) == (4 * BS, 4 * BS)
    # Behind a shared prefix stored by another session: counted from the prompt's start.
    hbm.apply([stored([10, 11], None, "a"), stored([20], 11, "b")])
    assert (hbm.hbm_tokens("b"), hbm.stored_tokens("b")) == (3 * BS, 3 * BS)
    hbm.apply(removed(20))
    assert (hbm.hbm_tokens("b"), hbm.stored_tokens("b")) == (2 * BS, 3 * BS)
    hbm.apply([{"type": "AllBlocksCleared"}])
    assert (hbm.hbm_tokens("s"), hbm.stored_tokens("s")) == (0, 4 * BS)
    assert next(iter(hbm.known())) == ("s", 0, 4 * BS)
    # Its parent stored before the events seen: its place, and so what it stored, not known.
    hbm.apply([stored([50], 99, "c")])
    assert (hbm.hbm_tokens("c"), hbm.stored_tokens("c")) == (None, None)


def test_a_block_evicted_in_the_middle_ends_the_run_and_its_restore_mends_it() -> None:
    hbm = EngineResidency()
    hbm.apply([stored([1, 2, 3, 4], None, "s")])
    hbm.apply(removed(2))
    assert hbm.hbm_tokens("s") == 1 * BS  # a hit stops at the first missing block
    # The next turn hits block 1 and recomputes 2 (same tokens, same hash); 3 and 4 still there.
    hbm.apply([stored([2], 1, "s")])
    assert hbm.hbm_tokens("s") == 4 * BS


def test_a_shared_prefix_counts_while_its_storer_holds_it() -> None:
    hbm = EngineResidency()
    hbm.apply([stored([10, 11], None, "a"), stored([12], 11, "a")])  # a system prompt, then a's
    hbm.apply([stored([20, 21], 11, "b")])  # b hit the system prompt, stored its own
    assert (hbm.hbm_tokens("a"), hbm.hbm_tokens("b")) == (3 * BS, 4 * BS)
    hbm.apply(removed(20, 21))
    assert hbm.hbm_tokens("b") == 2 * BS  # the system prompt still hits
    hbm.apply(removed(11))
    assert (hbm.hbm_tokens("a"), hbm.hbm_tokens("b")) == (1 * BS, 0)


def test_a_turn_that_does_not_continue_the_chain_starts_it_afresh() -> None:
    hbm = EngineResidency()
    hbm.apply([stored([1, 2, 3], None, "s")])
    hbm.apply([stored([7, 8], None, "s")])  # another context under the same session
    assert hbm.hbm_tokens("s") == 2 * BS
    hbm.apply(removed(3))  # the old chain's blocks no longer count for it
    assert hbm.hbm_tokens("s") == 2 * BS


def test_a_diverging_turn_drops_the_old_continuation() -> None:
    hbm = EngineResidency()
    hbm.apply([stored([1, 2, 3, 4], None, "s")])
    hbm.apply([stored([9], 2, "s")])  # regenerated from block 2 on: 3 and 4 are not its context
    assert hbm.hbm_tokens("s") == 3 * BS


def test_clear_and_gap() -> None:
    hbm = EngineResidency()
    hbm.apply([stored([1, 2], None, "s")])
    hbm.apply([{"type": "AllBlocksCleared"}])
    assert hbm.hbm_tokens("s") == 0 and hbm.blocks == 0
    hbm.apply([stored([1, 2], None, "s")])
    hbm.lost()  # events were missed: nothing known
    assert hbm.hbm_tokens("s") is None
    # A turn whose parent was stored before the gap: resident, its place unknown.
    hbm.apply([stored([3], 2, "s")])
    assert hbm.hbm_tokens("s") is None
    assert hbm.blocks == 1


def test_untagged_blocks_and_bytes_hashes() -> None:
    hbm = EngineResidency()
    hbm.apply([stored([1, 2], None)])  # a request without a session id
    assert hbm.sessions == 0 and hbm.blocks == 2
    hbm.apply([{"type": "BlockStored", "block_hashes": [b"\x00\x03"], "parent_block_hash": 2,
                "block_size": BS, "session_id": "s"}])
    assert hbm.hbm_tokens("s") == 3 * BS
    hbm.apply([{"type": "BlockRemoved", "block_hashes": [b"\x00\x03"]}])
    assert hbm.hbm_tokens("s") == 2 * BS  # only the shared part, stored untagged, remains


def test_sessions_are_bounded_oldest_forgotten_first() -> None:
    hbm = EngineResidency(max_sessions=2)
    for i, session in enumerate(("a", "b", "c")):
        hbm.apply([stored([100 + i], None, session)])
    assert hbm.sessions == 2
    assert (hbm.hbm_tokens("a"), hbm.hbm_tokens("c")) == (None, BS)


def test_changed_sessions_are_reported_once_and_ids_are_mapped() -> None:
    hbm = EngineResidency(session_key=lambda raw: None if raw == "skip" else raw.upper())
    hbm.apply([stored([1, 2], None, "a"), stored([3], None, "skip")])
    assert hbm.take_changed() == {"A"} and hbm.take_changed() == set()
    assert hbm.hbm_tokens("A") == 2 * BS and hbm.sessions == 1
    hbm.apply(removed(3))  # not a session's block: nobody changed
    assert hbm.take_changed() == set()
    hbm.apply(removed(2))
    assert hbm.take_changed() == {"A"}
    hbm.lost()
    assert hbm.take_changed() == {"A"} and hbm.hbm_tokens("A") is None
