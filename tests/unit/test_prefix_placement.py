"""Prefixes shared across sessions (`placement.load_gate.prefix_placement`): the bounded index of
leading blocks the gateway placed, and the gate's prefix step: a new session goes where its
prompt's leading blocks are held if that answers sooner and the load bound admits it; its
sticky turns never ask."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import pytest

from kvgate.bindings.memory import MemoryBindingStore
from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig, decision_settings
from kvgate.endpoints import EndpointDirectory
from kvgate.placement import session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.pick import candidates
from kvgate.placement.prefix import RoutedPrefixes
from kvgate.placement.view import Member, PoolView
from kvgate.routing import Pipeline, build_policy
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.policy import Known, Placing, PromptSize
from kvgate.routing.prefixes import PrefixStep
from kvgate.routing.recent import Seen

COST = EngineCost()  # 5,000 tokens/s
ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
VIEW = PoolView("coder", tuple(Member(a, "ddr") for a in ADDRESSES))
HASH = session_hash(b"session-1")
TEMPLATE = list(range(100, 140))  # 40 blocks of 256 tokens: a 10,240-token template
BLOCK = 256
ON = GateConfig(prefix_placement=True, candidates=1)


def test_the_index_answers_the_leading_blocks_placed_on_an_engine() -> None:
    index = RoutedPrefixes(capacity_blocks=1_000, block_tokens=BLOCK)
    index.record("a", [*TEMPLATE, 1, 2, 3])
    assert index.prefix_tokens("a", [*TEMPLATE, 7, 8]) == len(TEMPLATE) * BLOCK
    assert index.prefix_tokens("a", TEMPLATE[:5]) == 5 * BLOCK
    assert index.prefix_tokens("a", [99, *TEMPLATE]) == 0  # another first block: no prefix
    assert index.prefix_tokens("b", TEMPLATE) == 0
    assert list(index.holders([*TEMPLATE, 9])) == ["a"]
    assert list(index.holders([])) == []
    index.forget("a")
    assert index.prefix_tokens("a", TEMPLATE) == 0 and len(index) == 0


def test_the_index_is_bounded_per_engine_and_in_leading_blocks() -> None:
    index = RoutedPrefixes(capacity_blocks=50, block_tokens=BLOCK, leading_blocks=30)
    index.record("a", TEMPLATE)  # only its first 30 blocks
    assert len(index) == 30 and index.prefix_tokens("a", TEMPLATE) == 30 * BLOCK
    other = list(range(1_000, 1_040))
    index.record("b", other)  # another engine's LRU: a's blocks stay
    assert index.prefix_tokens("a", TEMPLATE) == 30 * BLOCK
    index.record("a", other)  # 30 more on a: its oldest 10 are forgotten
    # A's blocks were recorded last first, so its tail goes first: what it holds stays a prefix.
    assert index.prefix_tokens("a", TEMPLATE) == 20 * BLOCK
    assert index.prefix_tokens("b", other) == 30 * BLOCK
    with pytest.raises(ValueError, match="capacity_blocks"):
        RoutedPrefixes(capacity_blocks=0, block_tokens=BLOCK)


def test_a_block_is_known_on_every_engine_that_holds_it() -> None:
    """The peer's indexer keeps every holder of a block (indexer.go, `hashToPods`): a template
    placed on all 16 engines is known on 16, not on the last few."""
    index = RoutedPrefixes(capacity_blocks=1_000, block_tokens=BLOCK)
    engines = [f"e{n}" for n in range(16)]
    for engine in engines:
        index.record(engine, TEMPLATE)
    assert list(index.holders(TEMPLATE)) == engines
    assert all(index.prefix_tokens(e, TEMPLATE) == len(TEMPLATE) * BLOCK for e in engines)
    index.forget("e3")
    assert "e3" not in index.holders(TEMPLATE) and index.prefix_tokens("e3", TEMPLATE) == 0
    for engine in engines:
        index.forget(engine)
    assert len(index) == 0


def _gate(config: GateConfig, index: RoutedPrefixes, board: LoadBoard | None = None
          ) -> GatedPolicy:
    return GatedPolicy(COST, config, board or LoadBoard(), clock=lambda: 0.0, prefixes=index)


def _place(policy: GatedPolicy, blocks: Sequence[int], loads: dict[str, int] | None = None
           ) -> str | None:
    known = Known(0.0, (len(TEMPLATE) + 8) * BLOCK, Seen(0, None), "s", blocks)
    return policy.place(Placing(VIEW, HASH, loads or {}, 1.25), known, prefer_kv_pool=None,
                        exclude=None)


def test_a_new_session_goes_where_its_template_is_held_beyond_the_ring_candidates() -> None:
    order = list(candidates(VIEW, HASH, {}, 1.25))
    holder = order[-1]  # the ring's last: never among 1 candidate without the step
    index = RoutedPrefixes(1_000, BLOCK)
    index.record(holder, TEMPLATE)
    prompt = [*TEMPLATE, 1, 2]
    assert _place(_gate(ON, index), prompt) == holder
    assert _place(_gate(GateConfig(candidates=1), index), prompt) == order[0]  # step off
    assert _place(_gate(ON, index), []) == order[0]  # blocks not known: as without it
    # Held, but busier by more than it saves (10,240 tokens its siblings would read from the
    # DDR pool: ~0.15 s): not chosen.
    board = LoadBoard()
    board.routed(holder, 0.0, 5.0)
    assert _place(_gate(ON, index, board), prompt) == order[0]


def test_the_load_bound_still_caps_an_engine_a_popular_template_would_crowd() -> None:
    order = list(candidates(VIEW, HASH, {}, 1.25))
    holder = order[-1]
    index = RoutedPrefixes(1_000, BLOCK)
    index.record(holder, TEMPLATE)
    # 8 sessions in the pool, 2 on each other engine, 2 on the holder: ceil(1.25 * 9 / 4) = 3
    # admits it; one more there (3 of 9) puts it at its bound.
    loads = {a: 2 for a in ADDRESSES}
    assert _place(_gate(ON, index), [*TEMPLATE, 1], loads) == holder
    loads[holder] = 3
    loads[order[0]] = 1
    assert _place(_gate(ON, index), [*TEMPLATE, 1], loads) == order[0]


class _Exact:
    """Exact holdings (what the engines' KV events tell): one engine holds 10 blocks."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        return 10 * BLOCK if endpoint == self.holder else 0

    def holders(self, blocks: Sequence[int]) -> Collection[str]:
        return (self.holder,)


def test_a_move_within_the_ddr_pool_reads_less_where_the_prefix_is_held() -> None:
    holder = ADDRESSES[2]
    policy = GatedPolicy(COST, ON, LoadBoard(), clock=lambda: 0.0, prefixes=_Exact(holder))
    landed = policy.landing(holder, 0.0, PromptSize(20 * BLOCK, 18 * BLOCK), 18 * BLOCK,
                            TEMPLATE)
    assert (landed.hbm_tokens, landed.ddr_tokens) == (10 * BLOCK, 8 * BLOCK)
    other = policy.landing(ADDRESSES[0], 0.0, PromptSize(20 * BLOCK, 18 * BLOCK), 18 * BLOCK,
                           TEMPLATE)
    assert (other.hbm_tokens, other.ddr_tokens) == (0, 18 * BLOCK)


CONFIG = load_text("pools: [{name: p, kv_pool: a, endpoints: "
                   "[10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1, 10.0.0.4:1]}]\n")


def test_through_the_pipeline_a_second_session_joins_the_first_ones_template() -> None:
    """Session A is placed and its leading blocks recorded; B (another session, the same
    template) goes there too once A's prefill is done; A's sticky turn records nothing."""
    index = RoutedPrefixes(1_000, BLOCK)
    now = [0.0]
    policy = build_policy(ON, COST, LoadBoard(), clock=lambda: now[0], prefixes=index)
    # A load factor that admits two sessions on one engine of four (the bound has its own test).
    pipeline = Pipeline(MemoryBindingStore(), EndpointDirectory(CONFIG), 4.0, policy=policy)
    prompt = (len(TEMPLATE) + 2) * BLOCK

    async def run() -> list[str]:
        out = []
        for session, tail in (("a", [1, 2]), ("a", [1, 2, 3]), ("b", [5, 6])):
            now[0] += 100.0
            decision = await pipeline.decide("p", session.encode(), prompt,
                                             blocks=[*TEMPLATE, *tail])
            out.append(decision.endpoints[0])
        return out

    placed = asyncio.run(run())
    assert placed[0] == placed[1] == placed[2]  # a sticky, b beside a's template
    assert len(index) == len(TEMPLATE) + 4  # a's first turn and b's, not a's second turn
    assert list(index.holders(TEMPLATE)) == [placed[0]]
    # Without the step b goes where the ring puts it (another engine here).
    off = Pipeline(MemoryBindingStore(), EndpointDirectory(CONFIG), 4.0, policy=build_policy(
        GateConfig(candidates=1), COST, LoadBoard(), clock=lambda: now[0]))
    ring_b = asyncio.run(off.decide("p", b"b", prompt, blocks=[*TEMPLATE, 5, 6])).endpoints[0]
    assert ring_b != placed[0]


def test_the_settings_and_a_results_description() -> None:
    text = ("pools: [{name: p, endpoints: [10.0.0.1:1]}]\nplacement: {load_gate: "
            "{prefix_placement: true, prefix_index_blocks: 4096}}\n")
    gate = load_text(text).placement.load_gate
    assert gate.prefix_placement and gate.prefix_index_blocks == 4096
    assert "prefix_placement" not in decision_settings(GateConfig())  # results read as before
    assert decision_settings(gate)["prefix_index_blocks"] == 4096


def test_a_holders_kv_pool_siblings_are_priced_reading_the_prefix_from_ddr() -> None:
    """Two KV pools: the holder's sibling reads the template from its DDR pool (its engines
    store what they compute); an engine of the other pool prefills it."""
    view = PoolView("coder", tuple(Member(a, k) for a, k in zip(
        ADDRESSES, ["x", "x", "y", "y"], strict=True)))
    policy = GatedPolicy(COST, ON, LoadBoard(), clock=lambda: 0.0,
                         prefixes=_Exact(ADDRESSES[0]))
    assert policy.prefix is not None
    assert policy.prefix.pooled(view, TEMPLATE, 100_000) == {"x": 10 * BLOCK}
    assert policy.prefix.pooled(view, [], 100_000) == {}
    order = list(candidates(view, HASH, {}, 1.25))
    sibling = next(a for a in order if a == ADDRESSES[1])
    stranger = next(a for a in order if view.kv_pool_of(a) == "y")
    assert order.index(stranger) < order.index(sibling)  # a tie would go to the stranger
    # Both busy alike, the holder busiest: the sibling's read beats the stranger's prefill.
    board = LoadBoard()
    for address, backlog in ((ADDRESSES[0], 9.0), (sibling, 0.4), (ADDRESSES[2], 0.4),
                             (ADDRESSES[3], 0.4)):
        board.routed(address, 0.0, backlog)
    policy = GatedPolicy(COST, GateConfig(prefix_placement=True, candidates=4), board,
                         clock=lambda: 0.0, prefixes=_Exact(ADDRESSES[0]))
    known = Known(0.0, 20 * BLOCK, Seen(0, None), "s", TEMPLATE)
    assert policy.place(Placing(view, HASH, {}, 1.25), known, prefer_kv_pool=None,
                        exclude=None) == sibling


class _Everywhere:
    """Every engine holds the template (the agentic workload's shared system prompt); the
    ring's last one holds a little more."""

    def __init__(self, more: str) -> None:
        self.more = more

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        return 12 * BLOCK if endpoint == self.more else 10 * BLOCK

    def holders(self, blocks: Sequence[int]) -> Collection[str]:
        return ADDRESSES


def test_holders_beyond_the_ring_candidates_only_where_they_hold_more() -> None:
    order = list(candidates(VIEW, HASH, {}, 1.25))
    step = PrefixStep(_Everywhere(order[-1]))
    assert step.candidates(iter(order), 2, TEMPLATE, 100_000) == [*order[:2], order[-1]]
    step = PrefixStep(_Everywhere("elsewhere"))  # every engine holds as much: none added
    assert step.candidates(iter(order), 2, TEMPLATE, 100_000) == order[:2]
    assert step.candidates(iter(order), 2, [], 100_000) == order[:2]
