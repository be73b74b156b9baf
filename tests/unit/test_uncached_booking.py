"""`placement.load_gate.book_uncached_prefill`: the load board books a placed request's prefill
as the tokens its engine must compute (the prompt less what that engine holds of its leading
blocks), not the whole prompt; the rule itself (`placed_work`) and the gate's use of it."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pytest

from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig, decision_settings
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.view import Member, PoolView
from kvgate.routing.booking import placed_work
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.policy import Known

COST = EngineCost()
ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
VIEW = PoolView("coder", tuple(Member(a, "ddr") for a in ADDRESSES))
BLOCK = 256
HARNESS = list(range(100, 160))  # 60 blocks: a 15,360-token shared harness
ON = GateConfig(book_uncached_prefill=True, candidates=1)


def test_a_new_prompt_is_booked_less_what_its_engine_holds() -> None:
    assert placed_work(20_000, 0, 15_000, read_context=False) == (5_000, 0)
    assert placed_work(20_000, 0, 0, read_context=False) == (20_000, 0)  # held unknown: whole


def test_the_last_token_is_always_computed() -> None:
    # vLLM's get_computed_blocks caps a hit at num_tokens - 1: a prompt held whole costs 1.
    assert placed_work(4_096, 0, 4_096, read_context=False) == (1, 0)
    assert placed_work(4_096, 0, 10_000, read_context=False) == (1, 0)


def test_a_move_within_the_pool_reads_only_what_its_engine_lacks() -> None:
    # Context 30k read from DDR; the sibling holds the 15k harness: it reads 15k, not 30k.
    assert placed_work(32_000, 30_000, 15_000, read_context=True) == (2_000, 15_000)
    assert placed_work(32_000, 30_000, 0, read_context=True) == (2_000, 30_000)  # as before
    assert placed_work(32_000, 30_000, 31_000, read_context=True) == (1_000, 0)


def test_a_context_in_hbm_is_not_read() -> None:
    assert placed_work(32_000, 30_000, 15_000, read_context=False) == (2_000, 0)


class _Holds:
    """One engine's prefix cache holds the harness (the engines' KV events)."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        return len(HARNESS) * BLOCK if endpoint == self.holder else 0

    def holders(self, blocks: Sequence[int]) -> Collection[str]:
        return (self.holder,)


def _booked(policy: GatedPolicy, board: LoadBoard, endpoint: str, session: str,
            prompt: int, blocks: Sequence[int]) -> float:
    """The backlog a new session's placement on `endpoint` adds to its board."""
    before = board.backlog_s(endpoint, 0.0)
    for hook in policy.hooks:
        hook.routed("coder", session, VIEW, endpoint, None,
                    Known(0.0, prompt, None, session, blocks), moved=False)
    return board.backlog_s(endpoint, 0.0) - before


def test_the_gate_books_a_new_session_less_the_held_harness() -> None:
    prompt = 20_000
    board = LoadBoard()
    policy = GatedPolicy(COST, ON, board, clock=lambda: 0.0, prefixes=_Holds(ADDRESSES[0]))
    assert policy.prefix is None  # booking only: placement weighs nothing new
    blocks = [*HARNESS, 7, 8]
    here = _booked(policy, board, ADDRESSES[0], "s1", prompt, blocks)
    there = _booked(policy, board, ADDRESSES[1], "s2", prompt, blocks)
    held = len(HARNESS) * BLOCK
    assert here == pytest.approx(COST.prefill_s(prompt - held, prompt))
    assert there == pytest.approx(COST.prefill_s(prompt, prompt))
    # Off: the whole prompt, wherever the harness is.
    board = LoadBoard()
    off = GatedPolicy(COST, GateConfig(candidates=1), board, clock=lambda: 0.0,
                      prefixes=_Holds(ADDRESSES[0]))
    assert _booked(off, board, ADDRESSES[0], "s1", prompt, blocks) == pytest.approx(there)


def test_without_events_the_gate_books_less_where_it_placed_the_prefix() -> None:
    board = LoadBoard()
    policy = GatedPolicy(COST, ON, board, clock=lambda: 0.0, block_tokens=BLOCK)
    prompt = 20_000
    first = _booked(policy, board, ADDRESSES[0], "s1", prompt, [*HARNESS, 1])
    second = _booked(policy, board, ADDRESSES[0], "s2", prompt, [*HARNESS, 2])
    elsewhere = _booked(policy, board, ADDRESSES[1], "s3", prompt, [*HARNESS, 3])
    assert first == pytest.approx(COST.prefill_s(prompt, prompt))  # nothing placed there yet
    assert second == pytest.approx(COST.prefill_s(prompt - len(HARNESS) * BLOCK, prompt))
    assert elsewhere == pytest.approx(first)
    # No blocks (ext_proc today): the whole prompt, as without the setting.
    assert _booked(policy, board, ADDRESSES[2], "s4", prompt, ()) == pytest.approx(first)
    policy.forget(ADDRESSES[0])  # its cache is gone: booked whole again
    assert _booked(policy, board, ADDRESSES[0], "s5", prompt, [*HARNESS, 5]) == (
        pytest.approx(first))


def test_the_setting_reads_from_yaml_and_stays_out_of_results_when_off() -> None:
    config = load_text("pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"
                       "placement: {load_gate: {book_uncached_prefill: true}}\n")
    assert config.placement.load_gate.book_uncached_prefill
    assert "book_uncached_prefill" not in decision_settings(GateConfig())
    assert decision_settings(ON)["book_uncached_prefill"] is True


def test_a_placement_of_unknown_size_books_nothing_but_is_recorded() -> None:
    board = LoadBoard()
    policy = GatedPolicy(COST, ON, board, clock=lambda: 0.0, block_tokens=BLOCK)
    assert _booked(policy, board, ADDRESSES[0], "s1", 0, [*HARNESS, 1]) == 0.0
    held = len(HARNESS) * BLOCK
    assert _booked(policy, board, ADDRESSES[0], "s2", 20_000, [*HARNESS, 2]) == pytest.approx(
        COST.prefill_s(20_000 - held, 20_000))
