"""The DDR reads the gate books on each device's and node's link (kvgate.placement.links), and
the `link_backlog` term that prices a read behind them (kvgate.placement.terms)."""

from __future__ import annotations

import pytest

from emulator.transfer import TransferModel, TransferParams
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.states import EndpointState
from kvgate.placement import session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.links import LinkBacklog, host_of
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import candidates
from kvgate.placement.signals import EngineSignals
from kvgate.placement.terms import Candidate, DdrRead, QueuedDdrRead, make_terms
from kvgate.placement.view import Member, PoolView
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.policy import Known, Placing
from kvgate.routing.recent import Seen

COST = EngineCost()  # 20 GB/s a device, 144 GB/s a node, 256 KiB a token
TERMS = ("queue_wait", "ddr_read", "link_backlog", "prefill")
ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
VIEW = PoolView("coder", tuple(Member(a, "ddr") for a in ADDRESSES))
HASH = session_hash(b"session-1")


def test_an_idle_link_reads_at_the_cost_models_price_to_the_bit() -> None:
    links = LinkBacklog(COST)
    for tokens in (0, 1, 128, 40_000):
        assert links.read_s("a:1", 5.0, tokens) == pytest.approx(COST.transfer_s(tokens),
                                                                 rel=1e-12)
    assert links.wait_s("a:1", 5.0) == 0.0


def test_a_read_waits_for_what_is_booked_on_its_device_link_which_drains() -> None:
    links = LinkBacklog(COST)
    alone = COST.transfer_s(40_000) - COST.transfer_fixed_s  # 0.524 s of bytes
    ready = links.book("a:1", 0.0, 40_000)
    assert ready == pytest.approx(COST.transfer_s(40_000))
    # A second read behind it is through after both reads' bytes.
    assert links.read_s("a:1", 0.0, 40_000) == pytest.approx(2 * alone + COST.transfer_fixed_s)
    assert links.read_s("a:2", 0.0, 40_000) == pytest.approx(COST.transfer_s(40_000))
    # Half way, half of it is left; once through, nothing.
    assert links.wait_s("a:1", alone / 2) == pytest.approx(alone / 2)
    assert links.read_s("a:1", alone, 40_000) == pytest.approx(COST.transfer_s(40_000))
    links.forget("a:1")  # its device's reads are gone; its node's link still moves them
    assert links.wait_s("a:1", 0.0) == pytest.approx(40_000 * COST.kv_bytes_per_token / 144e9)


def test_devices_on_one_node_share_its_link_and_other_nodes_do_not() -> None:
    cost = EngineCost(ddr_gbps=20.0, node_gbps=30.0)
    links = LinkBacklog(cost, {"a": "n1", "b": "n1", "c": "n2"}.__getitem__)
    links.book("a", 0.0, 100_000)  # 26.2 GB: 1.31 s on its device, 0.87 s of its node's
    node_busy = 100_000 * cost.kv_bytes_per_token / 30e9
    assert links.wait_s("b", 0.0) == pytest.approx(node_busy)
    # The node's link is shared: b's read moves at half of it while a's is in flight.
    assert links.read_s("b", 0.0, 1_000) == pytest.approx(
        cost.transfer_fixed_s + 2 * 1_000 * cost.kv_bytes_per_token / 30e9)
    assert links.read_s("c", 0.0, 1_000) == pytest.approx(cost.transfer_s(1_000))
    # No node link (0): devices never wait on each other.
    alone = LinkBacklog(EngineCost(node_gbps=0.0), {"a": "n1", "b": "n1"}.__getitem__)
    alone.book("a", 0.0, 100_000)
    assert alone.wait_s("b", 0.0) == 0.0


def test_live_nodes_are_hosts() -> None:
    assert host_of("10.0.0.1:8000") == host_of("10.0.0.1:8001") == "10.0.0.1"
    assert host_of("[fe80::1]:8000") == "[fe80::1]"


def test_the_term_is_ddr_read_without_links_and_the_read_behind_them_with() -> None:
    board = LoadBoard()
    queued, plain = make_terms(("link_backlog", "ddr_read"), COST)
    assert isinstance(queued, QueuedDdrRead) and isinstance(plain, DdrRead)
    bare = Candidate(EngineSignals("a:1", 0.0, board), 50_000, ddr_tokens=40_000)
    assert queued.seconds(bare) == plain.seconds(bare)
    links = LinkBacklog(COST)
    links.book("a:1", 0.0, 40_000)
    behind = Candidate(EngineSignals("a:1", 0.0, board, links=links), 50_000,
                       ddr_tokens=40_000)
    assert queued.seconds(behind) > plain.seconds(behind) + 0.5


def _policy(terms: tuple[str, ...] = TERMS, hbm: object = None) -> GatedPolicy:
    return GatedPolicy(COST, GateConfig(terms=terms), LoadBoard(), clock=lambda: 0.0,
                       hbm=hbm)  # type: ignore[arg-type]


def test_the_gate_keeps_links_only_when_a_term_prices_them() -> None:
    assert _policy(GateConfig().terms).links is None  # the default: nothing more on any path
    assert _policy().links is not None


def test_a_move_books_its_read_and_the_next_placement_avoids_that_link() -> None:
    policy = _policy()
    first, second = list(candidates(VIEW, HASH, {}, 1.25))[:2]
    known = Known(0.0, 40_000, Seen(39_000, None), "s")
    # The session moves within its DDR pool onto `first`: its 39k-token context is read there.
    policy.hooks[0].routed("coder", "s", VIEW, first, ADDRESSES[-1] if first != ADDRESSES[-1]
                           else ADDRESSES[0], known, moved=True)
    assert policy.links is not None
    assert policy.links.wait_s(first, 0.0) > 0.45
    # Its prefill waits for that read (the booked ready time), as the board shows.
    assert policy.board.backlog_s(first, 0.0) == pytest.approx(
        COST.transfer_s(39_000) + COST.prefill_s(1_000, 40_000))
    # Another session re-placed within the pool, whose context is read wherever it goes, goes
    # elsewhere than the busy link; with the default terms the read is priced at the link's
    # whole rate and the gate sees only the queue there.
    placing = Placing(VIEW, HASH, {}, 1.25)
    other = Known(0.0, 40_000, Seen(39_000, None), "t")
    chosen = policy.place(placing, other, prefer_kv_pool="ddr", exclude=None)
    assert chosen not in (first, None)
    assert policy.score(first, 0.0, other.size, ddr_tokens=39_000) > policy.score(
        second, 0.0, other.size, ddr_tokens=39_000)


class Evicted:
    """Every engine's HBM has lost all of the session; none evicts (no re-homing)."""

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        return 0

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        return 0.0

    def eviction_rate(self, endpoint: str) -> float | None:
        return None


def test_a_session_whose_reload_waits_on_a_busy_link_moves_to_a_free_one() -> None:
    current = next(iter(candidates(VIEW, HASH, {}, 1.25)))
    known = Known(0.0, 60_000, Seen(59_000, None), "s")
    placing = Placing(VIEW, HASH, {current: 1}, 1.25)
    for terms, moves in ((GateConfig().terms, False), (TERMS, True)):
        policy = _policy(terms, Evicted())
        if policy.links is not None:
            for _ in range(8):  # 8 other sessions' 59k-token reloads queued on its link
                policy.links.book(current, 0.0, 59_000)
        moved = policy.reconsider(placing, current, EndpointState.ACTIVE, known)
        assert (moved is not None) is moves, terms
        if moved is not None:
            assert moved.endpoint != current
            assert moved.estimate.stay_s > 6.0


def test_a_short_read_shares_the_link_with_a_long_one_rather_than_waiting_for_it() -> None:
    # Fair sharing (emulator/transfer.py, TransferModel): a 10k-token read sent behind a
    # 200k-token one moves at half the link until it is through, after 2 x its bytes / rate,
    # not after both reads' bytes (first come, first served, the model before).
    links = LinkBacklog(COST)
    links.book("a:1", 0.0, 200_000)
    rate = COST.ddr_gbps * 1e9
    short = 10_000 * COST.kv_bytes_per_token
    assert links.read_s("a:1", 0.0, 10_000) == pytest.approx(
        COST.transfer_fixed_s + 2 * short / rate)
    # Each read ahead moves at most what it has left: one nearly through adds only that.
    long = 200_000 * COST.kv_bytes_per_token
    almost = (long - short / 4) / rate  # a quarter of the short read's bytes left
    assert links.read_s("a:1", almost, 10_000) == pytest.approx(
        COST.transfer_fixed_s + 1.25 * short / rate)
    # What is booked is through at the same time either way: the link is never idle.
    assert links.wait_s("a:1", 0.0) == pytest.approx(long / rate)
    assert links.wait_s("a:1", 1.0) == pytest.approx(long / rate - 1.0)


def _transfer_ready(sends: list[tuple[float, int, int]], params: TransferParams) -> float:
    """The emulator's transfer model: when the last of `sends` (time, device, tokens) is
    ready, nothing being sent after it."""
    model = TransferModel(params)
    last = -1
    for at, device, tokens in sends:
        model.finish_due(at)
        last = model.start(at, device, tokens * COST.kv_bytes_per_token)
    while True:
        for tid, ready in model.finish_due(model.next_done()):
            if tid == last:
                return ready


@pytest.mark.parametrize("sends", [
    [(0.0, 0, 100_000), (0.5, 0, 20_000), (1.0, 0, 50_000)],
    [(0.0, 0, 30_000), (0.1, 0, 30_000), (0.2, 0, 200_000), (0.3, 0, 5_000)],
    [(0.0, 0, 80_000), (3.0, 0, 10_000), (3.1, 0, 10_000)],  # the first is through by 3.0
])
def test_the_last_reads_ready_time_is_the_emulators_on_one_link(
        sends: list[tuple[float, int, int]]) -> None:
    cost = EngineCost(node_gbps=0.0)  # devices' links only, as the params below
    params = TransferParams(device_gbps=cost.ddr_gbps, node_gbps=None, devices_per_node=1,
                            fixed_ms=cost.transfer_fixed_s * 1000)
    links = LinkBacklog(cost, lambda address: address)
    ready = 0.0
    for at, _, tokens in sends:
        ready = links.book("a", at, tokens)
    assert ready == pytest.approx(_transfer_ready(sends, params), rel=1e-9)


def test_a_read_on_a_busy_node_gets_its_fair_share_of_the_nodes_link() -> None:
    # Two devices of one node, a 30 GB/s node link: the transfer model's max-min shares give
    # each of the two reads 15 GB/s while both are in flight.
    cost = EngineCost(ddr_gbps=20.0, node_gbps=30.0)
    params = TransferParams(device_gbps=20.0, node_gbps=30.0, devices_per_node=2,
                            fixed_ms=cost.transfer_fixed_s * 1000)
    links = LinkBacklog(cost, {"d0": "n", "d1": "n"}.__getitem__)
    links.book("d0", 0.0, 100_000)
    sends = [(0.0, 0, 100_000), (0.0, 1, 1_000)]
    assert links.book("d1", 0.0, 1_000) == pytest.approx(_transfer_ready(sends, params))


def test_a_call_from_before_the_last_booking_is_taken_at_it() -> None:
    # Live, two streams may book with their own clocks' readings slightly out of order.
    links = LinkBacklog(COST)
    links.book("a:1", 1.0, 40_000)
    assert links.read_s("a:1", 0.5, 40_000) == links.read_s("a:1", 1.0, 40_000)
    expected = links.read_s("a:1", 1.0, 40_000)
    assert links.book("a:1", 0.5, 40_000) - 0.5 == pytest.approx(expected)
