"""`calibrate --route direct`: the client routes as the mode would, with no gateway (the router
alone, then the emulated half against a real emulator process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from real_vllm import __main__ as main
from real_vllm.calibrate import calibration_workload
from real_vllm.direct import DirectRoutes, run_emulated_direct

URLS = ["http://e0", "http://e1", "http://e2"]


def test_round_robin_takes_the_engines_in_turn_whatever_the_session() -> None:
    route = DirectRoutes(RoutingMode.ROUND_ROBIN, URLS)
    assert [route(s) for s in ("a", "a", "b", "a", "c", "b")] == [*URLS, *URLS]


def test_affinity_keeps_each_session_and_places_new_ones_on_the_emptiest_engine() -> None:
    route = DirectRoutes(RoutingMode.AFFINITY, URLS)
    first = [route(s) for s in ("a", "b", "c", "d")]
    assert first == [*URLS, URLS[0]]  # balanced by sessions held, the earliest on a tie
    assert [route(s) for s in ("b", "d", "a", "c", "b")] == [
        URLS[1], URLS[0], URLS[0], URLS[2], URLS[1]]
    assert route("e") == URLS[1]  # e0 holds two sessions, e1 and e2 one each


def test_only_the_modes_a_client_can_route_alone() -> None:
    with pytest.raises(ValueError, match=r"not affinity\+ddr"):
        DirectRoutes(RoutingMode.AFFINITY_DDR, URLS)
    with pytest.raises(ValueError, match="no engine"):
        DirectRoutes(RoutingMode.AFFINITY, [])
    with pytest.raises(SystemExit):  # refused before any engine is started
        main.main(["calibrate", "--route", "direct", "--modes", "affinity+ddr"])
    with pytest.raises(SystemExit):
        main.main(["calibrate", "--route", "direct", "--backend", "sim"])


@pytest.mark.timeout(120)
async def test_the_emulated_half_runs_without_a_gateway(tmp_path: Path) -> None:
    workload = calibration_workload(seed=3, sessions=4)
    options = EmulatorOptions(instances=2, time_scale=0.05, block_size=16, no_ddr_pool=True)
    results = await run_emulated_direct(options, workload,
                                        [RoutingMode.ROUND_ROBIN, RoutingMode.AFFINITY],
                                        tmp_path, lambda line: None)
    rr, affinity = (results[m] for m in (RoutingMode.ROUND_ROBIN, RoutingMode.AFFINITY))
    for result in (rr, affinity):
        figures = result.stats.figures()
        assert figures["errors"] == 0 and figures["requests"] == len(workload.requests)
        assert len(result.engines) == 2  # answered by both engines
    # A session kept on one engine finds its own prefix there; taken in turn it often does not.
    assert affinity.stats.figures()["hit_rate"] > rr.stats.figures()["hit_rate"] + 0.1
    assert (tmp_path / "affinity" / "engines.log").exists()


def test_a_direct_run_is_not_replayed_through_the_simulators_gateway(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored = Path(__file__).resolve().parents[2] / "docs/results/calibration/direct-frontend-core"
    with pytest.raises(SystemExit):
        main.main(["calibrate", "--replay", str(stored), "--backend", "sim",
                   "--workdir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "routed by the client (--route direct)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
