"""The load gate as ext_proc runs it (pure parts): moves recorded in bindings, the metrics page
reader, the pipeline moving a session off a busy engine, and the handler's prompt estimate."""

from __future__ import annotations

import json

from ext_proc.metrics import ExtProcMetrics
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.model import Binding, MoveEstimate
from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.contract import vllm
from kvgate.contract.states import MoveReason
from kvgate.contract.vllm import EngineFigures
from kvgate.endpoints import EndpointDirectory
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.routing import GatedPolicy, Outcome, Pipeline
from kvgate.routing.engine_load import LOAD_GAUGES
from kvgate.routing.handler import RequestHandler
from kvgate.routing.sources import SessionSources

CONFIG = load_text("pools: [{name: p, kv_pool: a, endpoints: [10.0.0.1:1, 10.0.0.2:1]}]\n")


def test_binding_records_its_last_move_and_reads_records_without_it() -> None:
    old = Binding.decode("p/s", b'{"endpoint": "10.0.0.1:1", "hash": 7}', 3)
    assert (old.endpoint, old.hash, old.moved_at, old.move_reason) == ("10.0.0.1:1", 7, 0.0, None)
    assert json.loads(old.encode()) == {"endpoint": "10.0.0.1:1", "hash": 7}  # as before
    moved = old.moved_to("10.0.0.2:1", MoveReason.LOAD, at=1700000000.5)
    again = Binding.decode("p/s", moved.encode(), 4)
    assert (again.endpoint, again.moved_at, again.move_reason) == (
        "10.0.0.2:1", 1700000000.5, MoveReason.LOAD)
    assert moved.encode().startswith(b'{"endpoint": "10.0.0.2:1"')  # the mirror's fast path
    # A reason this version does not know (a newer writer's) is no reason, not a lost binding.
    newer = Binding.decode("p/s", b'{"endpoint": "e:1", "moved_at": 5, "reason": "x"}', 1)
    assert (newer.endpoint, newer.move_reason, newer.moved_at) == ("e:1", None, 0.0)


def read_load(text: str) -> dict[str, float]:
    return vllm.read_samples(text, LOAD_GAUGES)


def test_read_load_sums_label_sets_and_ignores_lookalikes() -> None:
    page = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a"} 3.0\n'
        'vllm:num_requests_waiting{model_name="b"} 2.0\n'
        'vllm:num_requests_waiting_by_reason{reason="x"} 100.0\n'
        "vllm:num_requests_running 7\n"
        'vllm:kv_cache_usage_perc{model_name="a"} 0.25'
    )
    assert read_load(page) == {"vllm:num_requests_waiting": 5.0,
                               "vllm:num_requests_running": 7.0,
                               "vllm:kv_cache_usage_perc": 0.25}
    assert read_load("") == {}


class RecordingStore(MemoryBindingStore):
    """Keeps what each move wrote (the compact index, like etcd's mirror, keeps no reason)."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[Binding] = []

    async def move(self, current: Binding, endpoint: str,
                   reason: MoveReason | None = None, *, optional: bool = False,
                   estimate: MoveEstimate | None = None) -> Binding:
        self.moves.append(current.moved_to(endpoint, reason, estimate=estimate))
        return await super().move(current, endpoint, reason, optional=optional,
                                  estimate=estimate)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _gated(enabled: bool = True) -> tuple[Pipeline, RecordingStore, LoadBoard, Clock]:
    clock = Clock()
    board = LoadBoard(max_age_s=2.0)
    store = RecordingStore()
    policy = GatedPolicy(EngineCost(), GateConfig(enabled=enabled), board, clock=clock)
    decider = Pipeline(store, EndpointDirectory(CONFIG), 4.0, policy=policy)
    return decider, store, board, clock


def _handler(decider: Pipeline) -> tuple[RequestHandler, ExtProcMetrics]:
    """ext_proc's handler over `decider`, prompts sized at 4 body bytes a token."""
    metrics = ExtProcMetrics()
    return RequestHandler(decider, SessionSources(CONFIG.session), metrics, "p",
                          bytes_per_token=4.0), metrics


async def test_a_session_on_a_busy_engine_moves_to_its_ddr_sibling_with_reason_load() -> None:
    decider, store, board, clock = _gated()
    first = await decider.decide("p", b"s1", prompt_tokens=2000)
    home = first.endpoints[0]
    sibling = next(e.key for e in CONFIG.pools[0].endpoints if e.key != home)
    # Under the threshold the session stays.
    clock.now += 5.0
    assert (await decider.decide("p", b"s1", 2000)).outcome is Outcome.STICKY
    # Its engine reports 20 s of queued prefill; the sibling is idle: it moves.
    board.observe(home, ObservedLoad(at=clock.now, backlog_s=20.0,
                                            figures=EngineFigures.of(waiting=10)))
    moved = await decider.decide("p", b"s1", 2000)
    assert (moved.outcome, moved.endpoints[0], moved.reason) == (
        Outcome.REBIND, sibling, MoveReason.LOAD)
    assert [(b.endpoint, b.move_reason) for b in store.moves] == [(sibling, MoveReason.LOAD)]
    # The move's record says what the gate estimated: there, per term, and staying.
    [record] = store.moves
    assert record.estimate is not None and dict(record.estimate.terms).keys() == {
        "queue_wait", "ddr_read", "prefill"}
    assert record.estimate.stay_s > sum(dict(record.estimate.terms).values()) + 1.5
    again = Binding.decode("p/s1", record.encode(), 9)
    assert again.estimate == record.estimate
    # Hysteresis: its new engine becomes as busy, yet it stays during the cooldown.
    board.observe(sibling, ObservedLoad(at=clock.now, backlog_s=40.0))
    board.observe(home, ObservedLoad(at=clock.now, backlog_s=0.0))
    assert (await decider.decide("p", b"s1", 2000)).outcome is Outcome.STICKY
    # A report older than max_age_s counts for nothing.
    clock.now += 31.0
    board.observe(sibling, ObservedLoad(at=clock.now - 3.0, backlog_s=1000.0))
    assert (await decider.decide("p", b"s1", 2000)).outcome is Outcome.STICKY


async def test_gate_disabled_keeps_static_stickiness() -> None:
    decider, _, board, clock = _gated(enabled=False)
    home = (await decider.decide("p", b"s1", 2000)).endpoints[0]
    board.observe(home, ObservedLoad(at=clock.now, backlog_s=100.0))
    again = await decider.decide("p", b"s1", 2000)
    assert (again.outcome, again.endpoints[0]) == (Outcome.STICKY, home)


async def test_handler_estimates_the_prompt_from_content_length_and_counts_rebinds() -> None:
    decider, _, board, clock = _gated()
    handler, metrics = _handler(decider)
    headers = {"x-session-id": b"s1", "content-length": b"40000"}
    first = await handler.decide(None, headers, None)
    home = first.endpoints[0]
    assert isinstance(decider.policy, GatedPolicy)
    seen = decider.policy.recent.get("p", first.session or "")
    assert seen is not None and seen.tokens == 10_000  # 40,000 bytes / 4
    clock.now += 5.0  # the next turn, once this one's prefill is done
    assert (await handler.decide(None, headers, None)).outcome is Outcome.STICKY
    clock.now += 5.0
    board.observe(home, ObservedLoad(at=clock.now, backlog_s=30.0))
    assert (await handler.decide(None, headers, None)).reason is MoveReason.LOAD
    sample = metrics.registry.get_sample_value
    assert sample("kvgate_ext_proc_rebinds_total", {"reason": "load"}) == 1.0
    assert sample("kvgate_ext_proc_rebinds_total", {"reason": "failed"}) == 0.0
    # Without a usable Content-Length the size is unknown (0), never an error.
    for bad in (b"", b"-1", b"12x"):
        answer = await handler.decide(None, {"x-session-id": b"s2", "content-length": bad}, None)
        assert answer.outcome in (Outcome.NEW, Outcome.STICKY)


class Evicting:
    """The engines' HBM residency: `home` has lost the session's context and evicts fast."""

    def __init__(self, home: str) -> None:
        self.home = home

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        return 0 if endpoint == self.home else None

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        return 0.0 if endpoint == self.home else None

    def eviction_rate(self, endpoint: str) -> float | None:
        return 50.0 if endpoint == self.home else 1.0


async def test_a_session_whose_engine_evicted_it_is_rehomed_with_reason_evicted() -> None:
    decider, store, _, clock = _gated()
    handler, metrics = _handler(decider)
    headers = {"x-session-id": b"s1", "content-length": b"8000"}
    home = (await handler.decide(None, headers, None)).endpoints[0]
    clock.now += 5.0
    assert isinstance(decider.policy, GatedPolicy)
    decider.policy.hbm = Evicting(home)  # no queue anywhere: only the eviction says move
    moved = await handler.decide(None, headers, None)
    assert (moved.outcome, moved.reason) == (Outcome.REBIND, MoveReason.EVICTED)
    assert moved.endpoints[0] != home
    assert [b.move_reason for b in store.moves] == [MoveReason.EVICTED]
    sample = metrics.registry.get_sample_value
    assert sample("kvgate_ext_proc_rebinds_total", {"reason": "evicted"}) == 1.0
    assert sample("kvgate_ext_proc_rebinds_total", {"reason": "load"}) == 0.0
