"""Replicas whose wall clocks differ decide alike: the decision path (the pipeline, the load
gate's board, cooldowns and the fleet-state figures' ages) runs on each process's monotonic
clock and on ages, never on wall time, so a replica hours off decides what a correct one
would. Wall time is only recorded (a binding's `moved_at`, shown by `kvgate sessions show`)."""

from __future__ import annotations

import time

import pytest

from kvgate.bindings.memory import MemoryBindingStore
from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.vllm import EngineFigures
from kvgate.endpoints import EndpointDirectory
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.routing import GatedPolicy, Pipeline

CONFIG = load_text("pools: [{name: p, kv_pool: a, endpoints: "
                   "[10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1]}]\n")


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


async def _decisions() -> list[tuple[str, str, str | None]]:
    """New sessions, sticky turns, a busy engine (moves, then the cooldown), a stale report."""
    clock = Clock()
    board = LoadBoard(max_age_s=2.0)
    policy = GatedPolicy(EngineCost(), GateConfig(cooldown_s=30.0), board, clock=clock)
    pipeline = Pipeline(MemoryBindingStore(clock=clock), EndpointDirectory(CONFIG), 4.0,
                        policy=policy)
    out = []

    async def turn(session: bytes) -> str:
        decision = await pipeline.decide("p", session, prompt_tokens=3000)
        out.append((decision.outcome.value, decision.endpoints[0],
                    None if decision.reason is None else decision.reason.value))
        return decision.endpoints[0]

    homes = [await turn(b"s%d" % i) for i in range(12)]
    for _ in range(3):
        clock.now += 5.0
        board.observe(homes[0], ObservedLoad(at=clock.now, backlog_s=40.0,
                                                 figures=EngineFigures.of(waiting=20)))
        board.observe(homes[1], ObservedLoad(at=clock.now - 10.0, backlog_s=90.0))  # stale
        for i in range(12):
            await turn(b"s%d" % i)
    return out


@pytest.mark.parametrize("skew_s", [-7200.0, 3.5, 86400.0])
async def test_a_replica_whose_wall_clock_is_off_decides_as_a_correct_one(
        skew_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    correct = await _decisions()
    assert any(reason == "load" for _, _, reason in correct)  # the gate really moved some
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew_s)
    assert await _decisions() == correct
