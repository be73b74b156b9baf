"""The gate compares a session's context, estimated from headers, with what its engine's HBM
holds, counted in whole blocks of real tokens, in one unit (kvgate.placement.signals
`held_context`): a sticky turn whose context is all there is not booked as a reload."""

from __future__ import annotations

from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.signals import held_context
from kvgate.routing.booking import Ledger
from kvgate.routing.policy import Known
from kvgate.routing.recent import RecentSessions, Seen

BLOCK = 128


class Held:
    """An engine holding `tokens` real tokens of the session (whole blocks), at most the cap."""

    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.asked: list[int] = []

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        self.asked.append(context_tokens)
        return None if self.tokens is None else min(self.tokens, context_tokens)

    def eviction_rate(self, endpoint: str) -> float | None:
        return None


def test_a_context_estimated_high_and_held_whole_is_all_there() -> None:
    # The journal's example: the prompt estimated 20,196 tokens is 147 real blocks of 128
    # (18,816 tokens); its last prompt, estimated 20,476, is held as 130 blocks (16,640).
    # Scaled to real tokens the context is 20,476 x 18,816 / 20,196 = 19,076: 149 whole
    # blocks. 130 held: 19 blocks left HBM, not the 3,836 tokens the raw comparison says.
    engine = Held(16_640)
    held = held_context(engine.hbm_tokens, "e", "s", 20_476, 20_196, 147, BLOCK)
    assert engine.asked == [149 * BLOCK]
    assert held == int(16_640 * 20_196 / (147 * BLOCK))
    assert 20_476 - held == 2_616  # read back, in the gate's units: 19 blocks (was 3,836)
    whole = Held(149 * BLOCK)  # every whole block of the context held: none read back
    assert held_context(whole.hbm_tokens, "e", "s", 20_476, 20_196, 147, BLOCK) == 20_476


def test_the_last_partial_block_is_never_missing() -> None:
    # Blocks not known (a sticky turn live: no body read): the context is counted as
    # estimated, rounded down to whole blocks, which is all an engine caches of it.
    engine = Held(78 * BLOCK)  # 10,000 tokens = 78 whole blocks + 16 tokens
    assert held_context(engine.hbm_tokens, "e", "s", 10_000, 11_000, 0, BLOCK) == 10_000
    fewer = Held(77 * BLOCK).hbm_tokens
    assert held_context(fewer, "e", "s", 10_000, 11_000, 0, BLOCK) == 77 * BLOCK
    assert held_context(Held(None).hbm_tokens, "e", "s", 10_000, 11_000, 0, BLOCK) is None
    # No block size known: compared as tokens, as before.
    assert held_context(Held(9_999).hbm_tokens, "e", "s", 10_000, 11_000, 0, None) == 9_999


def test_a_sticky_turn_held_whole_books_no_read() -> None:
    board = LoadBoard()
    ledger = Ledger(EngineCost(), board, RecentSessions(), PrefillMix())
    ledger.hbm = Held(149 * BLOCK)
    ledger.block_tokens = BLOCK
    known = Known(0.0, 20_196, Seen(20_476, None), "s", tuple(range(147)))
    ledger.kept("coder", "s", "e", known)
    # Booked with no read: the prefill is ready to start now (a read would delay it).
    assert board.backlog_s("e", 0.0) == EngineCost().prefill_s(0, 20_196)
    ledger.hbm = Held(100 * BLOCK)  # 49 whole blocks left HBM: a read is booked first
    ledger.kept("coder", "s", "f", known)
    assert board.backlog_s("f", 0.0) > EngineCost().prefill_s(0, 20_196)
