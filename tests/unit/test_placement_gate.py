"""The load gate's pure core: new sessions to the least estimated TTFT among their ring
candidates, bound sessions moved inside their DDR pool only when that saves enough."""

from __future__ import annotations

import pytest

from kvgate.config.sections.placement import GateConfig
from kvgate.contract.states import EndpointState
from kvgate.placement import session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import candidates
from kvgate.placement.view import Member, PoolView
from kvgate.routing.gated import GatedPolicy, Move
from kvgate.routing.policy import HbmResidency, Known, Placing, PoolResidency, PromptSize
from kvgate.routing.recent import Seen

HASH = session_hash(b"session-1")
COST = EngineCost()  # 5,000 tokens/s, c0 20 ms, 256 KiB/token over 20 GB/s
ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]


def _view(kv_pools: list[str] | None = None) -> PoolView:
    pools = kv_pools or ["ddr"] * len(ADDRESSES)
    return PoolView("coder", tuple(Member(a, k) for a, k in zip(ADDRESSES, pools, strict=True)))


def _ring_order(view: PoolView) -> list[str]:
    return list(candidates(view, HASH, {}, 1.25))


class _Gate:
    """The gated policy asked one question at a time, at a given instant."""

    def __init__(self, config: GateConfig, board: LoadBoard,
                 residency: PoolResidency | None = None,
                 hbm: HbmResidency | None = None) -> None:
        self.now = 0.0
        self.policy = GatedPolicy(COST, config, board, clock=lambda: self.now,
                                  residency=residency, hbm=hbm)

    def place(self, view: PoolView, hash_value: int, loads: dict[str, int], load_factor: float,
              now: float, size: PromptSize) -> str | None:
        self.now = now
        known = Known(now, size.prompt_tokens, Seen(size.context_tokens, None))
        return self.policy.place(Placing(view, hash_value, loads, load_factor), known,
                                 prefer_kv_pool=None, exclude=None)

    def reconsider(self, view: PoolView, current: str, hash_value: int, loads: dict[str, int],
                   load_factor: float, now: float, size: PromptSize,
                   moved_at: float | None = None) -> Move | None:
        """The move, through the policy's own checks (state, threshold, cooldown)."""
        known = Known(now, size.prompt_tokens, Seen(size.context_tokens, moved_at))
        placing = Placing(view, hash_value, loads, load_factor)
        state = view.state(current) or EndpointState.FAILED
        if self.policy.reconsider(placing, current, state, known) is None:
            return None
        # The figures behind the verdict (the same computation, asked again).
        return self.policy.move(placing, current, self.policy.board.backlog_s(current, now),
                                known)


def _gate(config: GateConfig | None = None, board: LoadBoard | None = None,
          residency: PoolResidency | None = None, hbm: HbmResidency | None = None) -> _Gate:
    return _Gate(config or GateConfig(), board or LoadBoard(), residency, hbm)


def _queue(board: LoadBoard, address: str, seconds: float, now: float = 0.0) -> None:
    board.routed(address, now, seconds)


def test_a_new_session_goes_where_the_ring_puts_it_when_nothing_is_queued() -> None:
    view = _view()
    gate = _gate()
    assert gate.place(view, HASH, {}, 1.25, 0.0, PromptSize(10_000)) == _ring_order(view)[0]


def test_ties_keep_ring_order() -> None:
    view = _view()
    board = LoadBoard()
    order = _ring_order(view)
    for address in order:  # the same queue everywhere: every estimate ties
        _queue(board, address, 3.0)
    assert _gate(board=board).place(view, HASH, {}, 1.25, 0.0, PromptSize(10_000)) == order[0]
    _queue(board, order[0], 0.5)  # the first is now worse: the next in ring order wins the tie
    assert _gate(board=board).place(view, HASH, {}, 1.25, 0.0, PromptSize(10_000)) == order[1]


def test_a_new_session_goes_to_the_least_estimated_ttft() -> None:
    view = _view()
    board = LoadBoard()
    order = _ring_order(view)
    for seconds, address in zip([9.0, 4.0, 1.0, 7.0], order, strict=True):
        _queue(board, address, seconds)
    assert _gate(board=board).place(view, HASH, {}, 1.25, 0.0, PromptSize(10_000)) == order[2]
    # Only the first `candidates` are scored: with 2, the third is never looked at.
    gate = _gate(GateConfig(candidates=2), board)
    assert gate.place(view, HASH, {}, 1.25, 0.0, PromptSize(10_000)) == order[1]
    # Turned off: static ring placement, whatever the queues.
    off = _gate(GateConfig(enabled=False), board)
    assert off.place(view, HASH, {}, 1.25, 0.0, PromptSize(10_000)) == order[0]


def test_placement_honours_the_load_bound() -> None:
    view = _view()
    board = LoadBoard()
    order = _ring_order(view)
    for address in order[:2] + order[3:]:
        _queue(board, address, 5.0)
    # The idle one holds 3 of 4 sessions: over 1.25 × its share, it is not a candidate.
    loads = {order[2]: 3, order[0]: 1}
    chosen = _gate(board=board).place(view, HASH, loads, 1.25, 0.0, PromptSize(10_000))
    assert chosen != order[2] and chosen is not None


def _bound_to(view: PoolView) -> tuple[str, list[str]]:
    """The session's engine (its ring's first) and its siblings; the session counts in its
    engine's load, as a bound session does."""
    order = _ring_order(view)
    return order[0], order[1:]


def _bound_and_queued(current_s: float,
                      sibling_s: float) -> tuple[PoolView, LoadBoard, str, list[str]]:
    """A session bound to the ring's first endpoint, ``current_s`` queued there and
    ``sibling_s`` at each DDR-pool sibling."""
    view = _view()
    board = LoadBoard()
    current, siblings = _bound_to(view)
    _queue(board, current, current_s)
    for address in siblings:
        _queue(board, address, sibling_s)
    return view, board, current, siblings


def test_a_bound_session_moves_to_a_ddr_sibling_past_both_thresholds() -> None:
    view, board, current, siblings = _bound_and_queued(6.0, 2.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    move = _gate(board=board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size)
    assert move is not None and move.endpoint in siblings
    # stay: 6 s queued + 1,000 new tokens; move: the DDR read hides in 2 s of queue.
    assert move.stay_s == pytest.approx(6.0 + 0.02 + 1_000 / 5_000)
    assert move.move_s == pytest.approx(2.0 + 0.02 + 1_000 / 5_000)


@pytest.mark.parametrize(("current_s", "sibling_s", "config", "moves"), [
    (6.0, 5.7, GateConfig(min_saving_s=0.5, miss_safe=False), False),  # 0.3 s < min_saving_s
    (6.0, 4.5, GateConfig(min_saving_s=0.5, miss_safe=False), False),  # 1.5 < 30 % of 6.2
    (6.0, 4.0, GateConfig(min_saving_s=0.5, miss_safe=False), True),  # saves 2.0 s ≥ both
    (6.0, 4.0, GateConfig(min_saving_s=2.5, miss_safe=False), False),
    (6.0, 4.7, GateConfig(miss_safe=False), False),  # the default 1.5 s: 1.3 s is not enough
    (6.0, 4.0, GateConfig(miss_safe=False), True),
])
def test_a_move_needs_both_the_saving_and_the_ratio(current_s: float, sibling_s: float,
                                                     config: GateConfig, moves: bool) -> None:
    view = _view()
    board = LoadBoard()
    current, siblings = _bound_to(view)
    _queue(board, current, current_s)
    for address in siblings:
        _queue(board, address, sibling_s)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    move = _gate(config, board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size)
    assert (move is not None) is moves


def test_a_move_must_not_lose_even_if_the_pool_lost_the_context() -> None:
    view, board, current, _siblings = _bound_and_queued(6.0, 4.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    # With its context read from the pool the sibling saves 2 s; without it, the sibling would
    # prefill 20,000 tokens (4 s) after 4 s of queue: slower than staying (6.2 s). No move.
    assert _gate(board=board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0,
                                         size) is None
    reckless = _gate(GateConfig(miss_safe=False), board)
    assert reckless.reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size) is not None
    _queue(board, current, 3.0)  # a longer queue here: now even a full prefill there is sooner
    move = _gate(board=board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size)
    assert move is not None and move.stay_s == pytest.approx(9.22)


class _Holds:
    """A pool whose holdings are known: ``tokens`` of any session's context."""

    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.asked: list[tuple[str, str, int]] = []

    def pool_tokens(self, kv_pool: str, session: str, context_tokens: int) -> int | None:
        self.asked.append((kv_pool, session, context_tokens))
        return None if self.tokens is None else min(self.tokens, context_tokens)


@pytest.mark.parametrize(("held", "moves"), [
    (19_000, True),  # the pool has it all: the move is priced with it, miss_safe has no doubt
    (0, False),  # it has none: a full prefill there (8 s) is slower than staying (6.2 s)
    (None, False),  # not known: miss_safe doubts, as without residency
])
def test_known_pool_holdings_price_the_move_instead_of_miss_safe(
        held: int | None, moves: bool) -> None:
    view, board, current, _siblings = _bound_and_queued(6.0, 4.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    holds = _Holds(held)
    move = _gate(board=board, residency=holds).reconsider(view, current, HASH, {current: 1},
                                                          1.25, 0.0, size)
    assert (move is not None) is moves
    assert holds.asked and holds.asked[0][2] == 19_000


def test_a_moved_session_stays_put_for_the_cooldown() -> None:
    view = _view()
    board = LoadBoard()
    current = _ring_order(view)[0]
    _queue(board, current, 60.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    gate = _gate(GateConfig(cooldown_s=30.0), board)
    loads = {current: 1}
    assert gate.reconsider(view, current, HASH, loads, 1.25, 10.0, size, moved_at=0.0) is None
    assert gate.reconsider(view, current, HASH, loads, 1.25, 29.9, size, moved_at=0.0) is None
    assert gate.reconsider(view, current, HASH, loads, 1.25, 30.0, size, moved_at=0.0) is not None


def test_no_sibling_in_its_ddr_pool_means_no_move() -> None:
    view = _view([f"hbm-{i}" for i in range(len(ADDRESSES))])  # every engine its own HBM
    board = LoadBoard()
    current = _ring_order(view)[0]
    _queue(board, current, 60.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    assert _gate(board=board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size) is None


def test_a_move_honours_the_load_bound() -> None:
    view = _view()
    board = LoadBoard()
    current, siblings = _bound_to(view)
    _queue(board, current, 30.0)
    _queue(board, siblings[1], 20.0)
    _queue(board, siblings[2], 20.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    # The idle sibling holds too many sessions for the bound (1.25 × 8 / 4 = 2.5 → 3).
    loads = {siblings[0]: 3, current: 2, siblings[1]: 2, siblings[2]: 1}
    move = _gate(board=board).reconsider(view, current, HASH, loads, 1.25, 0.0, size)
    assert move is not None and move.endpoint in siblings[1:]
    free = _gate(board=board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size)
    assert free is not None and free.endpoint == siblings[0]


class _CountingBoard(LoadBoard):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def backlog_s(self, address: str, now: float) -> float:
        self.asked.append(address)
        return super().backlog_s(address, now)


def test_under_the_threshold_a_sticky_request_looks_at_its_own_engine_only() -> None:
    view = _view()
    board = _CountingBoard()
    current = _ring_order(view)[0]
    _queue(board, current, 0.4)  # less than min_saving_s: moving cannot save enough
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    assert _gate(board=board).reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size) is None
    assert board.asked == [current]


class _InHbm:
    """An engine whose HBM holdings are known: ``tokens`` of the session's context."""

    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        return None if self.tokens is None else min(self.tokens, context_tokens)

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        """Of the context it stored (19,000 tokens, the tests' context), the share held."""
        return None if self.tokens is None else min(1.0, self.tokens / 19_000)

    def eviction_rate(self, endpoint: str) -> float | None:
        return None  # not known: no re-homing (tests/unit/test_gate_rehome.py)


@pytest.mark.parametrize(("in_hbm", "pool", "moves"), [
    (None, None, False),  # not known: staying is a hit, and miss-safe doubts the move (above)
    (19_000, None, False),  # all still there: the same
    (0, None, True),  # it left HBM: if the pool lost it, staying prefills it all too (10.02 s)
    (15_000, None, False),  # 4,000 tokens left: staying without the pool 7.02 s, moving 8.02 s
    (0, 0, False),  # the pool lost it too: both prefill 20,000; 8.02 against 10.02 s is < 30 %
    (None, 0, False),  # the pool lost it, HBM not known: staying is a hit (6.22 s)
])
def test_known_hbm_holdings_price_staying(in_hbm: int | None, pool: int | None,
                                         moves: bool) -> None:
    view, board, current, _siblings = _bound_and_queued(6.0, 4.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    gate = _gate(board=board, residency=None if pool is None else _Holds(pool),
                 hbm=_InHbm(in_hbm))
    move = gate.reconsider(view, current, HASH, {current: 1}, 1.25, 0.0, size)
    assert (move is not None) == moves
    if move is not None:  # the DDR read hides in either queue
        assert (move.stay_s, move.move_s) == (pytest.approx(6.22), pytest.approx(4.22))


def test_the_whole_prompt_is_priced_per_token_where_the_engines_cost_it() -> None:
    """`engine_cost.prompt_us_per_token`: the emulator's per-prompt-token rule, cached or not."""
    cost = EngineCost(prompt_s_per_token=10e-6)
    assert cost.prefill_s(1_000, 20_000) == pytest.approx(COST.prefill_s(1_000, 20_000) + 0.2)
    assert COST.prefill_s(1_000, 20_000) == pytest.approx(0.02 + 1_000 / 5_000)  # default 0
    board = LoadBoard()
    policy = GatedPolicy(cost, GateConfig(), board, clock=lambda: 0.0)
    policy.hooks[0].kept("coder", "s", ADDRESSES[0], Known(0.0, 20_000, Seen(19_000, None), "s"))
    assert board.backlog_s(ADDRESSES[0], 0.0) == pytest.approx(0.02 + 0.2 + 0.2)


def test_a_kept_request_whose_context_left_hbm_books_its_reload_first() -> None:
    _view, board, current, _siblings = _bound_and_queued(0.0, 0.0)
    size = PromptSize(prompt_tokens=20_000, context_tokens=19_000)
    hbm = _InHbm(None)
    gate = _gate(board=board, hbm=hbm)
    known = Known(0.0, size.prompt_tokens, Seen(size.context_tokens, None), "s")
    prefill = COST.prefill_s(1_000, 20_000)
    gate.policy.hooks[0].kept("coder", "s", current, known)
    assert board.backlog_s(current, 0.0) == pytest.approx(prefill)  # not known: a hit
    hbm.tokens = 4_000  # 15,000 tokens left its HBM: read back from the pool, then prefilled
    gate.policy.hooks[0].kept("coder", "s", current, known)
    assert board.backlog_s(current, 0.0) == pytest.approx(
        max(prefill, COST.transfer_s(15_000)) + prefill)
