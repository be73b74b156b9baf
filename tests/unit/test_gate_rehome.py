"""The load gate re-homes a session whose context has mostly left its engine's HBM to the
DDR-pool sibling that evicts slowest (kvgate.routing.gated `GatedPolicy.rehome`), and the
eviction rate it reads (kvgate.placement.evictions)."""

from __future__ import annotations

import pytest

from kvgate.config.sections.placement import GateConfig
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.placement import session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.evictions import MIN_SPAN_S, WINDOW_S, EvictionRate
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import candidates
from kvgate.placement.view import Member, PoolView
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.policy import Known, Placing
from kvgate.routing.recent import Seen

HASH = session_hash(b"session-1")
ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
CONTEXT, PROMPT = 19_000, 20_000


class Engines:
    """What each engine's HBM holds of the session, and how fast each evicts."""

    def __init__(self, held: dict[str, int], rates: dict[str, float | None]) -> None:
        self.held = held
        self.rates = rates

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        tokens = self.held.get(endpoint)
        return None if tokens is None else min(tokens, context_tokens)

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        """Of the context it stored (`CONTEXT`), the share held."""
        tokens = self.held.get(endpoint)
        return None if tokens is None else min(1.0, tokens / CONTEXT)

    def eviction_rate(self, endpoint: str) -> float | None:
        return self.rates.get(endpoint)


def _view(kv_pools: list[str] | None = None) -> PoolView:
    pools = kv_pools or ["ddr"] * len(ADDRESSES)
    return PoolView("coder", tuple(Member(a, k) for a, k in zip(ADDRESSES, pools, strict=True)))


def _decide(engines: Engines, board: LoadBoard | None = None, view: PoolView | None = None,
            moved_at: float | None = None, now: float = 100.0) -> tuple[str | None, str]:
    """(where the bound session goes, or None; the engine it is bound to)."""
    view = view or _view()
    current = next(iter(candidates(view, HASH, {}, 1.25)))
    policy = GatedPolicy(EngineCost(), GateConfig(), board or LoadBoard(),
                         clock=lambda: now, hbm=engines)
    known = Known(now, PROMPT, Seen(CONTEXT, moved_at), "s")
    placing = Placing(view, HASH, {current: 1}, 1.25)
    moved = policy.reconsider(placing, current, EndpointState.ACTIVE, known)
    if moved is not None:
        assert moved.reason is MoveReason.EVICTED  # told apart from a move for load
    return None if moved is None else moved.endpoint, current


def _engines(current_held: int, current_rate: float | None, sibling_rate: float | None
             ) -> tuple[Engines, str, list[str]]:
    current = next(iter(candidates(_view(), HASH, {}, 1.25)))
    siblings = [a for a in ADDRESSES if a != current]
    rates: dict[str, float | None] = {current: current_rate}
    rates.update({a: sibling_rate for a in siblings})
    return Engines({current: current_held}, rates), current, siblings


def test_an_evicted_context_goes_where_it_will_stay_longer() -> None:
    engines, _, siblings = _engines(1_000, 40.0, 10.0)
    slowest = siblings[2]
    engines.rates[slowest] = 4.0
    moved, _ = _decide(engines)
    assert moved == slowest  # no queue anywhere: the move costs what staying costs, the read


@pytest.mark.parametrize(("held", "current_rate", "sibling_rate"), [
    (12_000, 40.0, 4.0),  # most of the context is still in its HBM
    (1_000, 40.0, 25.0),  # no sibling evicts at most half as fast
    (1_000, None, 4.0),  # its engine's rate is not known
    (1_000, 0.0, 0.0),  # its engine evicts nothing: HBM is not why the context left
    (1_000, 40.0, None),  # the siblings' rates are not known
])
def test_it_stays_unless_its_context_left_and_a_sibling_keeps_contexts_longer(
        held: int, current_rate: float | None, sibling_rate: float | None) -> None:
    engines, _, _ = _engines(held, current_rate, sibling_rate)
    assert _decide(engines)[0] is None


def test_a_sibling_that_would_answer_later_is_not_a_home() -> None:
    engines, _, siblings = _engines(1_000, 40.0, 4.0)
    board = LoadBoard()
    for address in siblings:  # every sibling has 3 s queued: later than staying, read included
        board.routed(address, 100.0, 3.0)
    assert _decide(engines, board)[0] is None
    board = LoadBoard()
    board.routed(siblings[0], 100.0, 3.0)  # one busy sibling: the others still qualify
    assert _decide(engines, board)[0] in siblings[1:]


def test_rehoming_keeps_the_cooldown_and_the_ddr_pool() -> None:
    engines, _, _ = _engines(1_000, 40.0, 4.0)
    assert _decide(engines, moved_at=90.0)[0] is None  # moved 10 s ago: cooldown is 30 s
    assert _decide(engines, moved_at=60.0)[0] is not None
    # Each engine its own HBM, no shared pool: nowhere to read the context back from.
    assert _decide(engines, view=_view([f"hbm-{i}" for i in range(4)]))[0] is None


def test_an_eviction_rate_spans_about_a_minute_of_samples() -> None:
    rate = EvictionRate()
    assert rate.per_s() is None
    rate.sample(0.0, 100)
    rate.sample(MIN_SPAN_S / 2, 150)
    assert rate.per_s() is None  # a moment says nothing
    for second in range(1, 200):
        rate.sample(float(second), 100 + 10 * second)  # 10 blocks a second
    assert rate.per_s() == pytest.approx(10.0)
    for second in range(200, 300):  # then it stops evicting
        rate.sample(float(second), 100 + 10 * 199)
    assert rate.per_s() == pytest.approx(0.0, abs=10.0 / WINDOW_S)  # the window moved on
    rate.sample(300.0, 5)  # a restarted count (the engine restarted): start again
    assert rate.per_s() is None
