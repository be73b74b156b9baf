"""The load gate with `placement.load_gate.hbm_estimate: routed` and no KV events: what each
engine's HBM holds is estimated from what it routed (kvgate.placement.routed_hbm), and the
ledger, `move` and `rehome` use it as they use the engines' KV events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvgate.config import ConfigError, load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.placement import session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.placement.routed_hbm import RoutedHbm
from kvgate.placement.view import Member, PoolView
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.policy import Known, Placing
from kvgate.routing.recent import Seen

ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
VIEW = PoolView("coder", tuple(Member(a, "ddr") for a in ADDRESSES))
ENGINE = ADDRESSES[0]
COST = EngineCost(hbm_tokens=100_000)
ROUTED = replace(GateConfig(), hbm_estimate="routed")


def _policy(config: GateConfig, now: list[float], **kwargs: object) -> GatedPolicy:
    return GatedPolicy(COST, config, LoadBoard(), clock=lambda: now[0], **kwargs)  # type: ignore[arg-type]


def _place(policy: GatedPolicy, session: str, tokens: int, at: float) -> None:
    known = Known(at, tokens, None, session)
    for hook in policy.hooks:
        hook.routed("coder", session, VIEW, ENGINE, None, known, moved=False)


def _keep(policy: GatedPolicy, session: str, prompt: int, context: int, at: float) -> None:
    known = Known(at, prompt, Seen(context, None), session)
    for hook in policy.hooks:
        hook.kept("coder", session, ENGINE, known)


def test_it_is_off_by_default_and_kv_events_take_its_place() -> None:
    now = [0.0]
    assert GateConfig().hbm_estimate == "none"
    assert _policy(GateConfig(), now).hbm is None
    assert isinstance(_policy(ROUTED, now).hbm, RoutedHbm)
    events = RoutedHbm(1)  # stands for the engines' KV events (any HbmResidency)
    assert _policy(ROUTED, now, hbm=events).hbm is events


def test_a_kept_session_whose_context_was_evicted_books_its_reload() -> None:
    """With the estimate, the reload of an evicted context is booked before its prefill;
    without it, the same turn books its prefill alone."""
    backlogs = []
    for config in (GateConfig(), ROUTED):
        now = [0.0]
        policy = _policy(config, now)
        _place(policy, "old", 60_000, 0.0)
        _place(policy, "new", 60_000, 1.0)  # 120k in 100k: 20k of "old" left its HBM
        _keep(policy, "old", 61_000, 60_000, 100.0)
        backlogs.append(policy.board.backlog_s(ENGINE, 100.0))
    read = COST.transfer_s(20_000)
    assert backlogs[1] == pytest.approx(backlogs[0] + read)


def test_a_session_still_held_books_no_read() -> None:
    now = [0.0]
    policy = _policy(ROUTED, now)
    _place(policy, "s", 60_000, 0.0)
    _keep(policy, "s", 61_000, 60_000, 100.0)
    assert policy.board.backlog_s(ENGINE, 100.0) == pytest.approx(COST.prefill_s(1_000, 61_000))


def test_staying_is_priced_with_the_reload() -> None:
    """`move` prices staying with the read of what left its engine's HBM: behind a short
    queue the read is what a kept turn waits for."""
    moves = []
    for config in (GateConfig(), ROUTED):
        now = [10.0]
        policy = _policy(replace(config, min_saving_s=0.0, min_saving_ratio=0.0,
                                 miss_safe=False), now)
        if policy.hbm is not None:  # the engine fills with newer sessions: "old" is evicted
            estimate = policy.hbm
            assert isinstance(estimate, RoutedHbm)
            for i, session in enumerate(("old", "new0", "new1", "new2")):
                estimate.placed(ENGINE, session, 90_000, (), float(i))
            assert estimate.hbm_tokens(ENGINE, "old", 90_000) == 0
        policy.board.routed(ENGINE, 10.0, 0.5)  # half a second of prefill queued there
        known = Known(10.0, 91_000, Seen(90_000, None), "old")
        placing = Placing(VIEW, session_hash(b"old"), {a: 1 for a in ADDRESSES}, 1.25)
        moves.append(policy.move(placing, ENGINE, policy.board.backlog_s(ENGINE, 10.0), known))
    # Assumed in HBM, staying (0.5 s + its prefill) beats any sibling's read: no move.
    assert moves[0] is None
    # Estimated evicted, staying reads it back first, as a sibling would: even.
    move = moves[1]
    assert move is not None
    assert move.stay_s == pytest.approx(COST.transfer_s(90_000) + COST.prefill_s(1_000, 91_000))
    assert move.move_s == pytest.approx(move.stay_s)


def test_the_setting_is_read_from_the_yaml_and_bad_values_are_named() -> None:
    pools = "pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"
    config = load_text(pools + "placement: {load_gate: {hbm_estimate: routed}, "
                       "engine_cost: {hbm_tokens: 1200000}}\n")
    assert config.placement.load_gate.hbm_estimate == "routed"
    assert config.placement.engine_cost.hbm_tokens == 1_200_000
    assert config.placement.load_gate.reads_prompts  # a placement's blocks: the shared prefix
    with pytest.raises(ConfigError, match=r"placement\.load_gate\.hbm_estimate: "):
        load_text(pools + "placement: {load_gate: {hbm_estimate: lru}}\n")
    with pytest.raises(ConfigError, match=r"placement\.engine_cost\.hbm_tokens: "):
        load_text(pools + "placement: {engine_cost: {hbm_tokens: 0}}\n")
