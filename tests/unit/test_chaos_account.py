"""The fault harness's own measures: a streamed answer that stops in the middle is counted cut,
not failed; recovery is timed from the fault's end to the first sample from which the gateway
stayed on bindings, and a run watches until the latest sample is back; a soak's slope is per
hour; the sessions an engine is in the middle of."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import cast

from stack.local import Stack
from tests.support.chaos import Served, Traffic, account, mid_conversation
from tests.support.polling import eventually
from tests.support.recovery import OnBindings
from tests.support.soak import slope_per_hour, slope_percent_per_hour
from tests.support.upstreams import Upstream


async def _one_session(upstream: Upstream) -> Traffic:
    traffic = Traffic(f"http://{upstream.address}", workers=1, turns=2)
    running = asyncio.create_task(traffic.run())
    await eventually(lambda: len(traffic.served) >= 2 or running.done(),
                     what="a session's two turns")
    traffic.stop()
    await running
    return traffic


async def test_a_whole_stream_is_served_and_a_dropped_one_is_cut(
        upstreams: Callable[[int], Awaitable[list[Upstream]]]) -> None:
    whole, dying = await upstreams(2)
    dying.streams_die_after = 1
    served = (await _one_session(whole)).served
    assert len(served) >= 2
    assert {(s.engine, s.cut, s.error) for s in served} == {(whole.address, False, "")}
    served = (await _one_session(dying)).served
    assert all(s.engine == dying.address and s.cut and s.error for s in served), served
    row = account("a dying engine", served, {}, 1)
    assert (row.failed, row.cut) == (0, len(served))


async def test_a_stopped_upstream_fails_before_streaming(
        upstreams: Callable[[int], Awaitable[list[Upstream]]]) -> None:
    (gone,) = await upstreams(1)
    await gone.stop()
    served = (await _one_session(gone)).served
    assert served and all(s.engine is None and not s.cut for s in served), served
    assert account("gone", served, {}, 1).failed == len(served)


def _watch(samples: list[tuple[float, bool]]) -> OnBindings:
    return OnBindings(cast(Stack, SimpleNamespace()), samples)


def test_recovery_counts_from_the_fault_end_to_the_run_that_stayed_on_bindings() -> None:
    watch = _watch([(0.0, True), (1.0, False), (5.0, False), (6.0, True), (6.5, False),
                    (7.0, True), (8.0, True)])
    assert watch.recovered_after(5.5) == 1.5  # back at 6.0, off again at 6.5: 7.0 counts
    assert watch.recovered_after(7.0) == 0.0
    assert _watch([(0.0, False), (1.0, True)]).recovered_after(0.5) == 0.5
    assert _watch([(0.0, True), (1.0, False)]).recovered_after(0.5) is None
    assert _watch([(0.0, True)]).recovered_after(0.5) is None  # nothing sampled after the end


async def test_a_run_waits_for_the_latest_sample_to_be_back_not_any() -> None:
    loop = asyncio.get_running_loop()
    back_then_off = _watch([(0.0, True), (1.0, False), (2.0, True), (3.0, False)])
    started = loop.time()
    await back_then_off.back(1.5, 0.2)  # back at 2.0, off again at 3.0: it waits it out
    assert loop.time() - started >= 0.2
    assert back_then_off.recovered_after(1.5) is None
    started = loop.time()
    await _watch([(0.0, False), (2.0, True)]).back(1.5, 30.0)
    assert loop.time() - started < 1.0  # the latest sample is back: no wait


def test_a_soak_slope_is_per_hour_and_a_share_of_the_mean() -> None:
    rising = [(t, 100.0 + t / 360) for t in (0.0, 600.0, 1200.0, 1800.0)]  # +10 an hour
    assert abs(slope_per_hour(rising) - 10.0) < 1e-9
    mean = sum(v for _, v in rising) / len(rising)
    assert abs(slope_percent_per_hour(rising) - 1000.0 / mean) < 1e-9
    assert slope_per_hour([(0.0, 5.0)]) == 0.0 and slope_percent_per_hour([]) == 0.0


def test_an_engine_is_in_the_middle_of_sessions_it_answered_last_with_turns_to_come() -> None:
    def turn(session: str, engine: str | None) -> Served:
        return Served(session, 0.0, 0.0, engine)

    served = [turn("a", "e1"), turn("b", "e2"), turn("c", "e1"), turn("a", "e1"),
              turn("d", "e1"), turn("d", "e1"), turn("d", "e1"), turn("b", "e1"),
              turn("f", "e2"), turn("f", None)]  # f's second turn failed: e2 answered it last
    # Five turns each: a and b have three to come, one of them under way; c four; d two.
    assert mid_conversation(served, "e1", 5, 2) == ["a", "b", "c"]
    assert mid_conversation(served, "e1", 5, 3) == ["c"]
    assert mid_conversation(served, "e2", 5, 2) == ["f"]
    assert mid_conversation([], "e1", 5, 0) == []
