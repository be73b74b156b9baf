"""Scoring terms by name: the registry, the terms `placement.load_gate.terms` lists, a term that
reads a live signal (a reported gauge) through the engine's signals view, the one table of
gauges, each decision's seconds per term (at debug level, and a gate move's in `kvgate sessions
show`), and the one `build_policy`."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from control_plane.admin.servicer import session_binding
from control_plane.operations import SessionBinding
from kvgate.bindings.model import Binding, MoveEstimate
from kvgate.config import ConfigError, load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.contract import vllm
from kvgate.contract.states import MoveReason
from kvgate.contract.vllm import GAUGES, EngineFigures
from kvgate.fleet.scrape import LOAD_GAUGES
from kvgate.placement import session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.placement.pick import candidates
from kvgate.placement.signals import EngineSignals
from kvgate.placement.terms import (
    DEFAULT_TERMS,
    TERMS,
    Candidate,
    DdrRead,
    Estimate,
    Prefill,
    QueueWait,
    Term,
    make_terms,
)
from kvgate.placement.view import Member, PoolView
from kvgate.routing import STATIC, GatedPolicy, build_policy
from kvgate.routing.policy import Known, Placing
from kvgate.routing.recent import Seen
from kvgate_cli.admin import render

COST = EngineCost()
POOLS = "pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"
ADDRESSES = [f"10.0.0.{i}:8000" for i in range(1, 5)]
HASH = session_hash(b"session-1")
VIEW = PoolView("coder", tuple(Member(a, "ddr") for a in ADDRESSES))


def test_the_default_terms_are_named_and_their_sum_is_the_cost_models_to_the_bit() -> None:
    assert DEFAULT_TERMS == ("queue_wait", "ddr_read", "prefill")
    assert [TERMS[n] for n in DEFAULT_TERMS] == [QueueWait, DdrRead, Prefill]
    board = LoadBoard()
    board.routed("a:1", 0.0, 0.7)
    estimate = Estimate(make_terms(DEFAULT_TERMS, COST))
    for backlog_at, ddr, hbm in ((0.0, 30_000, 0), (0.3, 1_000, 5_000), (0.9, 0, 0)):
        engine = EngineSignals("a:1", backlog_at, board)
        candidate = Candidate(engine, 40_000, hbm_tokens=hbm, ddr_tokens=ddr)
        expected = max(board.backlog_s("a:1", backlog_at), COST.transfer_s(ddr)) + \
            COST.prefill_s(40_000 - hbm - ddr, 40_000)
        assert estimate.seconds(candidate) == expected  # exact: the same operations
        assert set(estimate.parts(candidate)) == set(DEFAULT_TERMS)
    with pytest.raises(ValueError, match="unknown scoring terms: link_bandwidth"):
        make_terms(["queue_wait", "link_bandwidth"], COST)



def test_a_read_after_the_wait_adds_to_it_as_vllms_scheduler_orders_it() -> None:
    board = LoadBoard()
    board.routed("a:1", 0.0, 0.7)
    engine = EngineSignals("a:1", 0.0, board)
    candidate = Candidate(engine, 40_000, ddr_tokens=30_000)
    wait, read = board.backlog_s("a:1", 0.0), COST.transfer_s(30_000)
    prefill = COST.prefill_s(10_000, 40_000)
    overlap = Estimate(make_terms(DEFAULT_TERMS, COST))
    after = Estimate(make_terms(("queue_wait", "ddr_read_after_wait", "prefill"), COST))
    assert overlap.seconds(candidate) == max(wait, read) + prefill
    assert after.seconds(candidate) == pytest.approx(wait + read + prefill, rel=1e-12)
    assert after.seconds(candidate) > overlap.seconds(candidate)
    assert after.parts(candidate)["ddr_read_after_wait"] == round(read, 6)
    queued = Estimate(make_terms(("queue_wait", "link_backlog_after_wait", "prefill"), COST))
    assert queued.seconds(candidate) == pytest.approx(wait + read + prefill, rel=1e-12)


class KvUsage(Term):
    """A term from a reported gauge: a second per unit of KV cache usage."""

    name = "kv_usage_test"
    overlaps_wait = False
    __slots__ = ()

    def seconds(self, candidate: Candidate) -> float:
        return candidate.engine.gauge("kv_usage") or 0.0


def _place(policy: GatedPolicy) -> str | None:
    return policy.place(Placing(VIEW, HASH, {}, 1.25), Known(0.0, 10_000, Seen(0, None), "s"),
                        prefer_kv_pool=None, exclude=None)


def test_a_term_reads_a_live_gauge_through_the_engines_signals() -> None:
    order = list(candidates(VIEW, HASH, {}, 1.25))
    board = LoadBoard()
    board.observe(order[0], ObservedLoad(0.0, figures=EngineFigures.of(kv_usage=0.9)))
    default = GatedPolicy(COST, GateConfig(), board, clock=lambda: 0.0)
    assert _place(default) == order[0]  # the default terms do not read the gauge
    terms = (*make_terms(DEFAULT_TERMS, COST), KvUsage(COST))
    assert _place(GatedPolicy(COST, GateConfig(), board, clock=lambda: 0.0,
                              terms=terms)) == order[1]


class _Log:
    """A structlog logger at a chosen level, keeping what it is given."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def is_enabled_for(self, level: int) -> bool:
        return level >= self.level

    def debug(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_each_placement_logs_its_seconds_per_term_at_debug_level() -> None:
    board = LoadBoard()
    order = list(candidates(VIEW, HASH, {}, 1.25))
    board.routed(order[0], 0.0, 3.0)
    log = _Log(logging.DEBUG)
    chosen = _place(GatedPolicy(COST, GateConfig(), board, clock=lambda: 0.0,
                                log=log))  # type: ignore[arg-type]
    assert chosen == order[1]
    [(event, fields)] = log.lines
    assert (event, fields["session"], fields["endpoint"]) == ("gate_placed", "s", order[1])
    assert fields["terms"] == {"queue_wait": 0.0, "ddr_read": 0.0,
                               "prefill": round(COST.prefill_s(10_000, 10_000), 6)}
    assert fields["estimate_s"] == pytest.approx(sum(fields["terms"].values()))
    quiet = _Log(logging.INFO)
    _place(GatedPolicy(COST, GateConfig(), board, clock=lambda: 0.0,
                       log=quiet))  # type: ignore[arg-type]
    assert quiet.lines == []


def test_the_terms_in_use_are_a_placement_key() -> None:
    assert load_text(POOLS).placement.load_gate.terms == DEFAULT_TERMS
    gate = load_text(POOLS + "placement: {load_gate: {terms: [prefill, queue_wait]}}\n"
                     ).placement.load_gate
    assert gate.terms == ("prefill", "queue_wait")
    policy = build_policy(gate, COST, LoadBoard())
    assert isinstance(policy, GatedPolicy)
    assert [t.name for t in policy.estimate.terms] == ["prefill", "queue_wait"]
    for terms, problem in (("[queue_wait, nope]", "placement.load_gate.terms[1]: must be one "
                            "of queue_wait, ddr_read, link_backlog, ddr_read_after_wait, "
                            "link_backlog_after_wait, prefill, got 'nope'"),
                           ("[]", "placement.load_gate.terms: at least one term"),
                           ("[prefill, prefill]", "placement.load_gate.terms: a term listed "
                            "twice")):
        with pytest.raises(ConfigError) as caught:
            load_text(POOLS + f"placement: {{load_gate: {{terms: {terms}}}}}\n")
        assert problem in str(caught.value)


def test_build_policy_is_static_when_the_gate_is_off() -> None:
    assert build_policy(GateConfig(enabled=False), COST, LoadBoard()) is STATIC
    assert isinstance(build_policy(GateConfig(), COST, LoadBoard()), GatedPolicy)


def test_one_table_of_gauges_reads_a_page_and_names_the_figures() -> None:
    assert LOAD_GAUGES == tuple(g.metric for g in GAUGES)
    page = (f"{vllm.NUM_REQUESTS_WAITING}{{model=\"m\"}} 3.0\n"
            f"{vllm.NUM_REQUESTS_RUNNING} 2\n{vllm.KV_CACHE_USAGE_PERC} 0.5\n")
    figures = EngineFigures.read(vllm.read_samples(page, LOAD_GAUGES))
    assert figures == EngineFigures.of(waiting=3, running=2, kv_usage=0.5)
    assert (figures.waiting, figures.running, figures.get("kv_usage")) == (3, 2, 0.5)
    assert isinstance(figures.waiting, int) and EngineFigures().values == (0, 0, 0.0)
    with pytest.raises(ValueError, match="not gauges: link_backlog"):
        EngineFigures.of(link_backlog=1.0)


def test_a_gate_moves_record_shows_its_seconds_per_term_in_sessions_show() -> None:
    estimate = MoveEstimate((("queue_wait", 4.0), ("ddr_read", 0.05), ("prefill", 0.2)), 6.2)
    bound = Binding("0b1c6a4e-0000-5000-8000-000000000001", "p", "10.0.0.1:1", 3, 7)
    moved = bound.moved_to("10.0.0.2:1", MoveReason.LOAD, at=1700000000.0, estimate=estimate)
    stored = Binding.decode(moved.key, moved.encode(), 4)
    assert stored.estimate == estimate
    # A move the gate did not make records none, also over one it did (a stale estimate).
    manual = stored.moved_to("10.0.0.3:1", MoveReason.MANUAL, at=1700000100.0)
    assert Binding.decode(manual.key, manual.encode(), 5).estimate is None
    assert b"terms" not in bound.moved_to("10.0.0.3:1", MoveReason.FAILED).encode()
    message = session_binding(SessionBinding(stored, 0))
    assert dict(message.move_terms) == dict(estimate.terms) and message.stay_s == 6.2
    shown = render.sessions_table([message])
    assert "load, 2023-11-14 22:13:20Z" in shown
    assert "(ddr_read 0.05s + prefill 0.20s + queue_wait 4.00s vs 6.20s staying)" in shown
    assert render.binding_dict(message)["move_terms"] == dict(estimate.terms)
    plain = session_binding(SessionBinding(Binding.decode(manual.key, manual.encode(), 5), 0))
    assert "staying" not in render.sessions_table([plain])
    assert render.binding_dict(plain)["move_terms"] is None


def test_a_connector_loading_in_the_step_puts_every_read_after_the_wait() -> None:
    in_step = dataclasses.replace(COST, pool_load="in_step")
    names = ("queue_wait", "ddr_read", "link_backlog", "prefill")
    assert [t.name for t in make_terms(names, in_step)] == [
        "queue_wait", "ddr_read_after_wait", "link_backlog_after_wait", "prefill"]
    assert [t.name for t in make_terms(names, COST)] == list(names)

