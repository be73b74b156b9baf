"""The gate's context is estimated from headers, what an engine's HBM holds is counted in whole
blocks of real tokens: the gate takes the share held of what the session stored there, unit-free
(kvgate.placement.signals `held_context`), so a sticky turn whose context is all there is not
booked as a reload however far its estimate is off."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.fleet.residency import EngineResidency
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.signals import held_context
from kvgate.routing.booking import Ledger
from kvgate.routing.policy import Known
from kvgate.routing.recent import RecentSessions, Seen

BLOCK = 128


class Held:
    """An engine holding `share` of what the session last stored there (None: not known)."""

    def __init__(self, share: float | None) -> None:
        self.share = share
        self.asked = 0

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        self.asked += 1
        return self.share

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        raise AssertionError("the gate asks for the share held, not tokens")

    def eviction_rate(self, endpoint: str) -> float | None:
        return None


def test_held_context_is_the_share_held_of_the_context() -> None:
    assert held_context(Held(None).hbm_share, "e", "s", 20_476) is None
    assert held_context(Held(1.0).hbm_share, "e", "s", 20_476) == 20_476
    assert held_context(Held(0.5).hbm_share, "e", "s", 20_476) == 10_238
    assert held_context(Held(0.0).hbm_share, "e", "s", 20_476) == 0


def _board(events: list[dict[str, Any]]) -> HbmBoard:
    """A replica's board as the collector's stream fills it from one engine's KV events."""
    residency = EngineResidency()
    residency.apply(events)
    board = HbmBoard()
    board.apply(pb.FleetLoad(residency_full=True, residency=[pb.SessionResidency(
        endpoint="e", session=session, tokens=tokens or 0, unknown=tokens is None,
        stored=stored or 0) for session, tokens, stored in residency.known()]))
    return board


# The session's last prompt and answer: 160 whole blocks of 128 real tokens (20,480), in one
# chain. The gate estimated that prompt 20 % high: 24,576 tokens.
STORED = [{"type": "BlockStored", "block_hashes": list(range(1, 161)), "parent_block_hash": None,
           "token_ids": [], "block_size": BLOCK, "session_id": "s"}]
CONTEXT, PROMPT = 24_576, 25_000


def test_a_session_estimated_high_and_held_whole_books_no_read() -> None:
    # Compared in tokens (the context put in real tokens by the current request's ratio, 1
    # on a sticky turn live: no body read) 24,576 > 20,480 held: a read of 4,096 was booked.
    board, cost = LoadBoard(), EngineCost()
    ledger = Ledger(cost, board, RecentSessions(), PrefillMix())
    ledger.hbm = _board(STORED)
    known = Known(0.0, PROMPT, Seen(CONTEXT, None), "s")
    assert ledger.held("e", known, CONTEXT) == CONTEXT
    ledger.kept("coder", "s", "e", known)
    # Booked with no read: the prefill is ready to start now (a read would delay it).
    assert board.backlog_s("e", 0.0) == pytest.approx(cost.prefill_s(PROMPT - CONTEXT, PROMPT))


def test_half_the_stored_run_evicted_is_half_the_context() -> None:
    # vLLM frees a request's blocks tail first: the last 80 go, the leading 80 stay.
    evicted = [{"type": "BlockRemoved", "block_hashes": list(range(160, 80, -1))}]
    board, cost = LoadBoard(), EngineCost()
    ledger = Ledger(cost, board, RecentSessions(), PrefillMix())
    ledger.hbm = _board(STORED + evicted)
    known = Known(0.0, PROMPT, Seen(CONTEXT, None), "s")
    assert ledger.held("e", known, CONTEXT) == CONTEXT // 2  # compared in tokens: 10,240
    ledger.kept("coder", "s", "e", known)
    assert board.backlog_s("e", 0.0) == pytest.approx(
        cost.transfer_s(CONTEXT // 2) + cost.prefill_s(PROMPT - CONTEXT, PROMPT))
    assert ledger.held("other", known, CONTEXT) is None  # not known there: the gate assumes it held


@pytest.mark.parametrize("pool_load", ["async", "in_step"])
def test_a_read_behind_a_queue_is_hidden_by_it_unless_the_connector_loads_in_step(
        pool_load: str) -> None:
    # vLLM's asynchronous connectors read while the request waits; AscendStore and LMCache, by
    # default, read before the forward of the step that schedules it, and the engine waits.
    evicted = [{"type": "BlockRemoved", "block_hashes": list(range(160, 80, -1))}]
    board, cost = LoadBoard(), EngineCost(pool_load=pool_load)
    ledger = Ledger(cost, board, RecentSessions(), PrefillMix())
    ledger.hbm = _board(STORED + evicted)
    ledger.sessionless("e", 0.0, 50_000)  # 10 s queued ahead: longer than the read
    queued = board.backlog_s("e", 0.0)
    ledger.kept("coder", "s", "e", Known(0.0, PROMPT, Seen(CONTEXT, None), "s"))
    read = cost.transfer_s(CONTEXT // 2) if pool_load == "in_step" else 0.0
    assert board.backlog_s("e", 0.0) == pytest.approx(
        queued + read + cost.prefill_s(PROMPT - CONTEXT, PROMPT))
