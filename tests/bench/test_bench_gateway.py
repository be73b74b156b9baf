"""`kvgate bench --gateway` against an emulated engine (an OpenAI-compatible endpoint)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from bench_helpers import gateway_answering, small_bank, streamed_answer

from bench.client import DriveOptions, GatewayUnreachable, drive
from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from kvgate_cli.main import main
from simulator.run import SimConfig, simulate_async
from tests.support.ports import free_port
from workload.model import Request, Segment, Workload

SCALE = 0.01  # 240 emulated seconds in 2.4 wall seconds


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    options = EmulatorOptions(instances=1, time_scale=SCALE, block_size=16, no_ddr_pool=True)
    async with Fleet(options) as fleet:
        yield fleet.engines[0]


async def test_drive_measures_hits_like_the_simulator_and_excludes_warmup(engine: str) -> None:
    workload = small_bank(sessions=10)
    workload.warmup_s = 60.0
    measured = sum(1 for r in workload.requests if workload.measured(r))
    assert 0 < measured < len(workload.requests)
    url = f"http://{engine}"
    result = await drive(workload, DriveOptions(url, time_scale=SCALE, engines=[url]))
    f = result.stats.figures()
    assert (f["requests"], f["errors"]) == (measured, 0)
    assert result.engines == {engine: len(workload.requests)}
    assert result.counters is not None and result.counters.queries > 0
    # cached_tokens (usage) and the /metrics delta agree; no DDR tier here
    assert f["hbm_hit_rate"] == pytest.approx(f["hit_rate"], abs=0.03)
    assert f["ddr_hit_rate"] == 0.0
    expected = (await simulate_async(workload, RoutingMode.AFFINITY,
                        SimConfig(EmulatorOptions(instances=1, block_size=16)))).stats.figures()
    assert f["hit_rate"] == pytest.approx(expected["hit_rate"], abs=0.02)
    assert f["hit_rate"] > 0.3
    assert 0 < f["ttft_p50_s"] <= f["ttft_p99_s"] < 60


async def test_a_later_turn_resends_the_answer_it_got_and_hits_its_cached_blocks(
        engine: str) -> None:
    chain = [Segment(1, 40), Segment(2, 100), Segment(3, 20), Segment(4, 50), Segment(5, 20)]
    workload = Workload("two-turns", [
        Request(0.0, "s", chain, 3, 50),  # 160 prompt tokens, a 50-token answer
        Request(10.0, "s", chain, 5, 8, think_s=5.0),  # 160 + the answer + 20
    ])
    result = await drive(workload, DriveOptions(f"http://{engine}", time_scale=SCALE))
    assert (result.stats.prompt_tokens, result.stats.errors) == (160 + 230, 0)
    # Turn 2 finds turn 1's prompt and answer, in whole 16-token blocks: (160 + 49) // 16 = 13.
    # With the workload's own answer text it would find the prompt's 10 blocks only.
    assert result.stats.cached_tokens == 13 * 16
    expected = (await simulate_async(workload, RoutingMode.AFFINITY,
                        SimConfig(EmulatorOptions(instances=1, block_size=16)))).stats
    assert expected.cached_tokens == result.stats.cached_tokens


async def test_bench_command_writes_outputs(engine: str, tmp_path: Path) -> None:
    args = ["bench", "--gateway", f"http://{engine}", "--engine-urls", f"http://{engine}",
            "--sessions", "4", "--duration-s", "120", "--time-scale", str(SCALE),
            "--block-size", "16", "--out", str(tmp_path), "--quiet"]
    assert await asyncio.to_thread(main, args) == 0
    document = json.loads((tmp_path / "bench-bank-coding.json").read_text())
    assert list(document["modes"]) == ["gateway"]
    assert document["modes"]["gateway"]["errors"] == 0
    assert document["modes"]["gateway"]["requests"] > 0


async def test_unreachable_gateway_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    workload = small_bank(sessions=2, duration_s=20)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GatewayUnreachable, match="/v1/models"):
        await drive(workload, DriveOptions(url, time_scale=SCALE, model="m"))
    args = ["bench", "--gateway", url, "--sessions", "2", "--duration-s", "20", "--quiet"]
    assert await asyncio.to_thread(main, args) == 1
    assert f"cannot use the gateway: {url}/v1/models" in capsys.readouterr().err


async def test_failing_requests_are_counted_as_errors() -> None:
    async def refuse(_: web.Request) -> web.Response:
        return web.Response(status=503)

    workload = small_bank(sessions=2, duration_s=20)
    async with gateway_answering(refuse) as url:
        result = await drive(workload, DriveOptions(url, SCALE))
    assert result.stats.errors == len(workload.requests) > 0


async def test_a_later_turn_is_sent_after_the_previous_answer_and_the_think_time() -> None:
    log: list[tuple[str, float, float]] = []  # (event, wall time, request's max_tokens)

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        log.append(("received", time.monotonic(), body["max_tokens"]))
        await asyncio.sleep(0.3)  # a slow answer
        response = await streamed_answer(request)
        log.append(("answered", time.monotonic(), body["max_tokens"]))
        return response

    chain = [Segment(1, 20), Segment(2, 5), Segment(3, 5), Segment(4, 5), Segment(5, 5)]
    # Nominal arrivals 0 and 1 emulated second apart; the second turn thinks 10 s (0.1 s wall).
    workload = Workload("w", [Request(0.0, "s", chain, 2, 1),
                              Request(1.0, "s", chain, 4, 2, think_s=10.0)])
    async with gateway_answering(complete) as url:
        result = await drive(workload, DriveOptions(url, SCALE))
    assert result.stats.errors == 0 and len(result.stats.ttfts) == 2
    events = [(kind, tokens) for kind, _, tokens in log]
    assert events == [("received", 1), ("answered", 1), ("received", 2), ("answered", 2)]
    assert log[2][1] - log[1][1] >= 10.0 * SCALE - 0.01


async def test_without_an_engine_header_requests_are_attributed_from_each_engines_metrics() -> None:
    options = EmulatorOptions(instances=2, time_scale=SCALE, block_size=16, no_ddr_pool=True)
    workload = small_bank(sessions=6, duration_s=60)
    async with Fleet(options) as fleet:
        urls = [f"http://{e}" for e in fleet.engines]
        # Round robin over both engines by the client itself: a stand-in for any gateway.
        result = await drive(workload, DriveOptions(urls[0], time_scale=SCALE, engines=urls,
                                                    engine_headers=("x-not-sent",)))
    assert result.stats.errors == 0
    # Every request went to the first engine; the second served none and is not listed.
    assert result.engines == {fleet.engines[0]: len(workload.requests)}


async def test_bench_gateway_reports_the_engines_it_saw_not_the_fleet_default(
        engine: str, tmp_path: Path) -> None:
    args = ["bench", "--gateway", f"http://{engine}", "--sessions", "3", "--duration-s", "30",
            "--time-scale", str(SCALE), "--block-size", "16", "--out", str(tmp_path),
            "--quiet"]
    assert await asyncio.to_thread(main, args) == 0
    document = json.loads((tmp_path / "bench-bank-coding.json").read_text())
    assert document["workload"]["engines"] == 1  # not --engines' default of 4
