"""`kvgate bench --compare --fleet-source collector`: the load-aware modes learn the engines'
state from the control plane's collector, which reads each emulated engine's own KV event
stream, so the gate knows which sessions' blocks each engine's HBM holds, on the real stack."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from bench_helpers import small_bank

from bench.compare import CompareOptions, compare, reserved_ports, stack_for
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from kvgate.session import normalize_session
from kvgate_cli.main import main
from tests.support.collector import residency_of
from tests.support.polling import eventually

SCALE = 1 / 40
BS = 16


def _options(tmp_path: Path, instances: int = 2) -> CompareOptions:
    engine = EmulatorOptions(instances=instances, block_size=BS, hbm_tokens=20_000,
                             time_scale=SCALE)
    return CompareOptions(engine, tmp_path, fleet_source="collector")


def test_every_mode_publishes_kv_events_and_only_the_gate_reads_them(tmp_path: Path) -> None:
    options = _options(tmp_path, instances=3)
    with reserved_ports(options) as ports:
        # consecutive engines, so that one offset finds each engine's own stream
        assert ports.engines == tuple(range(ports.engines[0], ports.engines[0] + 3))
        assert (ports.events, ports.replay) == (ports.engines[0] + 3, ports.engines[0] + 6)
        for mode in (RoutingMode.AFFINITY_DDR, RoutingMode.STICKY_DDR,
                     RoutingMode.ROUND_ROBIN_DDR):
            stack = stack_for(mode, options, ports)
            args = " ".join(stack.emulator_args)
            assert f"--kv-events-port {ports.events}" in args, mode
            assert f"--kv-events-replay-port {ports.replay}" in args, mode
            feed = stack.config.placement.load_gate.feed
            assert feed == ("collector" if mode.load_aware else None), mode
        gate = stack_for(RoutingMode.AFFINITY_DDR, options, ports).config.placement.load_gate
        _, offset, replay_offset = gate.kv_event_ports
        assert ports.engines[0] + offset == ports.events
        assert ports.events + replay_offset == ports.replay


async def test_the_gated_stack_learns_each_sessions_hbm_from_its_engines_events(
        tmp_path: Path) -> None:
    options = _options(tmp_path)
    session = "compare-collector"
    key = normalize_session(session.encode())
    assert key is not None
    prompt = list(range(1000, 1000 + 10 * BS))
    with reserved_ports(options) as ports:
        stack = stack_for(RoutingMode.AFFINITY_DDR, options, ports)
        await stack.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://{stack.config.listener}",
                                         timeout=60) as http:
                for _ in range(2):
                    reply = await http.post("/v1/completions",
                                            headers={"x-session-id": session},
                                            json={"prompt": prompt, "max_tokens": 1})
                    assert reply.status_code == 200, reply.text
                seen = await eventually(
                    lambda: residency_of(stack.config.control_plane.admin, key),
                    until=lambda held: any((t or 0) >= 10 * BS for t in held.values()),
                    what="the collector reports the session's blocks in one engine's HBM")
                # on the engine that served it, and on no other
                assert sum(1 for tokens in seen.values() if tokens) == 1, seen

                async def residency_pairs() -> list[float]:
                    pages = [(await http.get(f"http://{a}/metrics")).text
                             for a in stack.ext_proc_metrics]
                    return [float(line.rsplit(" ", 1)[1]) for page in pages
                            for line in page.splitlines()
                            if line.startswith("kvgate_ext_proc_hbm_residency_pairs ")]

                await eventually(residency_pairs, until=lambda n: bool(n) and min(n) >= 1,
                                 what="ext_proc's gate holds the session's residency")
        finally:
            await stack.stop()


@pytest.mark.timeout(240)
async def test_a_comparison_with_the_collector_serves_every_request(tmp_path: Path) -> None:
    workload = small_bank(sessions=12, duration_s=120)
    modes = (RoutingMode.AFFINITY_DDR, RoutingMode.STICKY_DDR)
    results = await compare(workload, modes, _options(tmp_path))
    for mode in modes:
        figures = results[mode].stats.figures()
        assert figures["errors"] == 0, mode
        assert figures["requests"] == len(workload.requests), mode
    assert results[modes[0]].endpoints == results[modes[1]].endpoints


def test_the_fleet_source_is_refused_without_compare(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--gateway", "http://127.0.0.1:1", "--fleet-source", "collector",
                 "--sessions", "2", "--duration-s", "60"])
    assert code == 2
    assert "--fleet-source applies to --compare only" in capsys.readouterr().err
