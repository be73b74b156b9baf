"""Load from every request: with the load gate on, a request with no session and a known size is
routed by the gate and booked on its engine, so an engine busy with a large sessionless prompt
shows that backlog to the next decision (issue 41: BACKLOG 0.00 s beside a 5 MB prompt)."""

from __future__ import annotations

from kvgate.bindings.memory import MemoryBindingStore
from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.endpoints import EndpointDirectory
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.routing import STATIC, Outcome, Pipeline, build_policy
from kvgate.routing.handler import DecisionMetrics, RequestHandler
from kvgate.routing.sources import SessionSources

CONFIG = load_text("pools: [{name: p, kv_pool: a, endpoints: "
                   "[10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1]}]\n")
ENGINES = {e.key for e in CONFIG.pools[0].endpoints}
COST = EngineCost()  # 5,000 prompt tokens a second


def _handler(board: LoadBoard, gate: GateConfig | None = None) -> RequestHandler:
    policy = build_policy(gate or GateConfig(), COST, board, clock=lambda: 0.0)
    pipeline = Pipeline(MemoryBindingStore(), EndpointDirectory(CONFIG), 1.25, policy=policy)
    return RequestHandler(pipeline, SessionSources(CONFIG.session), DecisionMetrics("ext_proc"),
                          "p", bytes_per_token=None if policy is STATIC else 4.0)


async def test_a_large_sessionless_prompt_is_booked_where_the_gate_sends_it() -> None:
    board = LoadBoard()
    handler = _handler(board)
    five_mb = {"content-length": str(5 * 1024 * 1024).encode()}
    decision = await handler.decide(None, five_mb, None)
    assert decision.outcome is Outcome.SESSIONLESS and decision.session is None
    busy, fallback = decision.endpoints
    assert busy in ENGINES and fallback in ENGINES - {busy}
    prompt = 5 * 1024 * 1024 // 4
    assert board.backlog_s(busy, 0.0) == COST.prefill_s(prompt, prompt)  # about 262 s
    # A new session now avoids it; so does the next sessionless request.
    placed = await handler.decide(None, {"x-session-id": b"s-1",
                                         "content-length": b"4000"}, None)
    assert placed.outcome is Outcome.NEW and placed.endpoints[0] != busy
    after = await handler.decide(None, {"content-length": b"4000"}, None)
    assert after.endpoints[0] != busy


async def test_sessionless_requests_turn_over_the_engines() -> None:
    handler = _handler(LoadBoard())
    sent = [(await handler.decide(None, {"content-length": b"40000"}, None)).endpoints[0]
            for _ in range(12)]
    assert set(sent) == ENGINES  # each booked one adds to its engine: the next goes elsewhere


async def test_unknown_size_or_gate_off_leaves_it_to_envoy_and_books_nothing() -> None:
    board = LoadBoard()
    unknown = await _handler(board).decide(None, {}, None)  # no body: /v1/models, say
    assert (unknown.outcome, unknown.endpoints) == (Outcome.SESSIONLESS, ())
    off = await _handler(board, GateConfig(enabled=False)).decide(
        None, {"content-length": b"4000000"}, None)
    assert (off.outcome, off.endpoints) == (Outcome.SESSIONLESS, ())
    assert all(board.backlog_s(engine, 0.0) == 0.0 for engine in ENGINES)
