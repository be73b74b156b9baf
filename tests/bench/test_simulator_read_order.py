"""`--pool-read-order vllm` (simulator.read_order): a request reading KV from the pool reads once
its engine's scheduler reaches it, lets the requests behind it pass while it reads, then goes
first; `step` reads once reached and holds the engine's prefill until it ends; `connector` is
whichever of the two the profile's connector does; the default reads from its arrival and
queues behind what was booked meanwhile."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bench_helpers import small_bank

from emulator.options import EmulatorOptions
from emulator.pool_profiles import PROFILES, KvLoad
from kvgate.contract.modes import PdMode, RoutingMode
from kvgate_cli.main import main
from simulator.read_order import InStepReadOrder, VllmReadOrder
from simulator.run import (
    READ_AS_CONNECTOR,
    READ_IN_STEP,
    READ_WHEN_REACHED,
    FleetEvent,
    SimConfig,
    SimResult,
    read_order_of,
    simulate,
)
from simulator.simulation import Simulation
from workload.model import Request, Segment, Workload

A, LOADED, B, C = range(4)  # request indices, in arrival order


def _one_engine() -> Workload:
    """One engine. A: 20k tokens, a 4 s prefill. LOADED, sent at 0.1 s: 16k tokens the pool
    holds (a 0.21 s read, 16 tokens to compute). B and C, at 0.2 and 0.3 s: 2k new tokens each
    (0.4 s prefills)."""
    return Workload("one engine", [
        Request(0.0, "a", [Segment(1, 20_000)], 1, 2),
        Request(0.1, "loaded", [Segment(2, 16_000)], 1, 2),
        Request(0.2, "b", [Segment(3, 2_000)], 1, 2),
        Request(0.3, "c", [Segment(4, 2_000)], 1, 2),
    ])


def _run(kind: type[Simulation], events: tuple[FleetEvent, ...] = ()) -> SimResult:
    config = SimConfig(EmulatorOptions(instances=1, block_size=16), events=events)
    sim = kind(_one_engine(), RoutingMode.ROUND_ROBIN_DDR, config)
    assert sim.pool is not None
    sim.pool.store(sim.blocks.hashes(LOADED), 0, 0, 0.0)
    return asyncio.run(sim.run())


def test_by_default_the_read_starts_on_arrival_and_queues_behind_what_came_meanwhile() -> None:
    finishes = _run(Simulation).finishes
    # Loaded at ~0.31 s, after B and C were booked behind A: last.
    assert finishes[A] < finishes[B] < finishes[C] < finishes[LOADED]


def test_vllm_reads_when_reached_lets_b_pass_then_goes_ahead_of_c() -> None:
    finishes = _run(VllmReadOrder).finishes
    assert finishes[A] < finishes[B] < finishes[LOADED] < finishes[C]
    # Reached when A's prefill ends (~4.02 s), read 0.21 s: not loaded before B starts.
    assert finishes[LOADED] > finishes[A] + 0.3


def test_in_step_reads_when_reached_and_nothing_behind_it_starts_before_it_ends() -> None:
    finishes = _run(InStepReadOrder).finishes
    assert finishes[A] < finishes[LOADED] < finishes[B] < finishes[C]
    passed = _run(VllmReadOrder).finishes
    # B waits for the read (0.21 s) as well as LOADED's prefill; LOADED itself ends no later.
    assert finishes[B] > passed[B] + 0.2 and finishes[LOADED] <= passed[LOADED]


def test_connector_is_each_profile_s_own_order() -> None:
    orders = {name: read_order_of(READ_AS_CONNECTOR, profile)
              for name, profile in PROFILES.items()}
    assert orders == {name: READ_WHEN_REACHED if p.kv_load is KvLoad.ASYNC else READ_IN_STEP
                      for name, p in PROFILES.items()}
    assert orders["ascend-store"] == READ_IN_STEP and orders["vllm-offload"] == READ_WHEN_REACHED
    assert read_order_of(READ_WHEN_REACHED, PROFILES["ascend-store"]) == READ_WHEN_REACHED


def test_an_idle_engine_reads_on_arrival_in_both_orders() -> None:
    def lone(kind: type[Simulation]) -> float:
        config = SimConfig(EmulatorOptions(instances=1, block_size=16))
        sim = kind(Workload("lone", [_one_engine().requests[LOADED]]),
                   RoutingMode.ROUND_ROBIN_DDR, config)
        assert sim.pool is not None
        sim.pool.store(sim.blocks.hashes(0), 0, 0, 0.0)
        result = asyncio.run(sim.run())
        assert result.ddr_tokens == [15_984]
        return result.finishes[0]

    assert lone(VllmReadOrder) == lone(Simulation) == lone(InStepReadOrder)


@pytest.mark.parametrize("kind", [VllmReadOrder, InStepReadOrder])
def test_a_failed_engine_fails_its_waiting_queue(kind: type[Simulation]) -> None:
    result = _run(kind, (FleetEvent("fail", 0, 1.0),))
    assert result.stats.figures()["errors"] == 4


def test_the_option_reaches_the_simulation_and_moves_a_busy_fleet() -> None:
    workload = small_bank(sessions=40, duration_s=120.0, context=6000)
    options = EmulatorOptions(instances=2, block_size=16, hbm_tokens=20_000)
    figures = {order: simulate(workload, RoutingMode.ROUND_ROBIN_DDR,
                               SimConfig(options, pool_read_order=order)).stats
               for order in ("arrival", READ_WHEN_REACHED, READ_IN_STEP, READ_AS_CONNECTOR)}
    for stats in figures.values():
        assert stats.figures()["errors"] == 0
    assert figures["arrival"].ttfts != figures[READ_WHEN_REACHED].ttfts
    assert figures[READ_IN_STEP].ttfts != figures[READ_WHEN_REACHED].ttfts
    assert figures[READ_AS_CONNECTOR].ttfts == figures[READ_IN_STEP].ttfts  # ascend-store


def test_p_d_modes_and_unknown_orders_are_refused() -> None:
    options = EmulatorOptions(instances=2, block_size=16)
    with pytest.raises(ValueError, match="not modelled with --pd"):
        simulate(small_bank(sessions=2), PdMode.KVGATE,
                 SimConfig(options, pd=(1, 1), pool_read_order=READ_WHEN_REACHED))
    with pytest.raises(ValueError, match="pool read order must be one of"):
        simulate(small_bank(sessions=2), RoutingMode.ROUND_ROBIN_DDR,
                 SimConfig(options, pool_read_order="later"))


def test_the_flag_is_recorded_only_when_set_and_refused_with_pd(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["simulate", "--engines", "2", "--sessions", "20", "--duration-s", "300",
             "--modes", "round_robin+ddr", "--out", str(tmp_path), "--quiet", "--no-oracle"]
    for order, name in (("arrival", "default"), ("vllm", "vllm")):
        assert main([*flags, "--pool-read-order", order, "--name", name]) == 0
    described = {name: json.loads((tmp_path / f"{name}.json").read_text())["workload"]
                 for name in ("default", "vllm")}
    assert "pool_read_order" not in described["default"]  # committed results keep their keys
    assert described["vllm"]["pool_read_order"] == "vllm"
    assert main(["simulate", "--engines", "2", "--pd", "1:1", "--modes", "pd-kvgate",
                 "--pool-read-order", "vllm", "--quiet"]) == 2
    assert "--pool-read-order vllm is not modelled with --pd" in capsys.readouterr().err
