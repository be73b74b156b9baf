"""The load gate's prices for an emulated fleet: the emulator's own engine figures, in wall
seconds at its time scale, so ext_proc estimates what the emulated engines really take.

ext_proc prices requests on its own (wall) clock; an emulated engine at time scale 1/20 runs 20×
faster in wall time than its figures say. The gate's own seconds are emulated seconds in the
same way and are scaled too (GateConfig.at_time_scale); how often ext_proc looks and how old a
report may be stay wall seconds.
"""

from __future__ import annotations

from dataclasses import replace

from emulator.options import EmulatorOptions
from kvgate.config.model import Placement
from kvgate.placement.cost import EngineCost

# Engines at time scale 0: as fast as the configuration allows, nothing to wait for.
INSTANT = EngineCost(prefill_tokens_per_s=1e9, prefill_overhead_s=0.0, ddr_gbps=1e6,
                     transfer_fixed_s=0.0, node_gbps=0.0)


def emulated_cost(engine: EmulatorOptions, time_scale: float) -> EngineCost:
    """`engine`'s speed as ext_proc sees it in wall time (`time_scale` > 0)."""
    return EngineCost(
        prefill_tokens_per_s=engine.prefill_tokens_per_s / time_scale,
        prefill_overhead_s=engine.prefill_overhead_ms / 1000 * time_scale,
        kv_bytes_per_token=engine.kv_bytes_per_token or 1,
        ddr_gbps=engine.ddr_gbps / time_scale,
        transfer_fixed_s=engine.transfer_fixed_ms / 1000 * time_scale,
        prompt_s_per_token=engine.prompt_us_per_token / 1e6 * time_scale,
        node_gbps=engine.node_gbps / time_scale,
        hbm_tokens=max(1, engine.hbm_tokens),  # tokens: no time in it
    )


def for_emulated_fleet(placement: Placement, engine: EmulatorOptions, time_scale: float,
                       *, gate_on: bool | None = None) -> Placement:
    """`placement` priced for the emulated `engine` at `time_scale`; `gate_on` overrides the
    gate's switch (None: as configured). At a time scale of 0 the engines never wait: they are
    priced as instant, so no backlog ever builds and the gate moves nothing."""
    gate = placement.load_gate
    if gate_on is not None:
        gate = gate.turned(gate_on)
    if time_scale <= 0:
        return replace(placement, load_gate=gate,
                       engine_cost=replace(INSTANT, hbm_tokens=max(1, engine.hbm_tokens)))
    return replace(placement, load_gate=gate.at_time_scale(time_scale),
                   engine_cost=emulated_cost(engine, time_scale))
