"""`placement:` in the YAML: bounded load, the load gate and the engines' speed it prices with.

Strict like the rest of the file: unknown keys are refused, each problem names its field.
"""

from __future__ import annotations

from typing import Any

from kvgate.config.fields import Fields, Path
from kvgate.config.model import LoadGateConfig, Placement
from kvgate.placement.cost import EngineCost

PLACEMENT_KEYS = ("load_factor", "load_gate", "engine_cost")
LOAD_GATE_KEYS = ("enabled", "min_saving_s", "min_saving_ratio", "cooldown_s", "candidates",
                  "miss_safe", "refresh_s", "max_load_age_s", "bytes_per_token")
ENGINE_COST_KEYS = ("prefill_tokens_per_s", "prefill_overhead_s", "kv_bytes_per_token",
                    "ddr_gbps", "transfer_fixed_ms")


def read_placement(f: Fields, value: Any, path: Path) -> Placement:
    raw = f.mapping(value, path, PLACEMENT_KEYS)
    d = Placement()
    return Placement(
        load_factor=f.optional(raw, "load_factor", path, lambda v, p: f.number(v, p, 1.0, 100.0),
                               d.load_factor),
        load_gate=f.optional(raw, "load_gate", path, lambda v, p: _load_gate(f, v, p),
                             d.load_gate),
        engine_cost=f.optional(raw, "engine_cost", path, lambda v, p: _engine_cost(f, v, p),
                               d.engine_cost),
    )


def _load_gate(f: Fields, value: Any, path: Path) -> LoadGateConfig:
    raw = f.mapping(value, path, LOAD_GATE_KEYS)
    d = LoadGateConfig()

    def seconds(key: str, low: float, high: float, default: float) -> float:
        return f.optional(raw, key, path, lambda v, p: f.duration(v, p, low, high), default)

    gate = LoadGateConfig(
        enabled=f.optional(raw, "enabled", path, lambda v, p: _boolean(f, v, p), d.enabled),
        min_saving_s=seconds("min_saving_s", 0.0, 3600.0, d.min_saving_s),
        min_saving_ratio=f.optional(raw, "min_saving_ratio", path,
                                    lambda v, p: f.number(v, p, 0.0, 1.0), d.min_saving_ratio),
        cooldown_s=seconds("cooldown_s", 0.0, 86400.0, d.cooldown_s),
        candidates=f.optional(raw, "candidates", path, lambda v, p: f.integer(v, p, 1, 1024),
                              d.candidates),
        miss_safe=f.optional(raw, "miss_safe", path, lambda v, p: _boolean(f, v, p),
                             d.miss_safe),
        refresh_s=seconds("refresh_s", 0.01, 60.0, d.refresh_s),
        max_load_age_s=seconds("max_load_age_s", 0.01, 3600.0, d.max_load_age_s),
        bytes_per_token=f.optional(raw, "bytes_per_token", path,
                                   lambda v, p: f.number(v, p, 0.1, 1000.0), d.bytes_per_token),
    )
    if (gate.max_load_age_s < gate.refresh_s and not f.failed((*path, "refresh_s"))
            and not f.failed((*path, "max_load_age_s"))):
        f.error((*path, "max_load_age_s"),
                f"must be at least refresh_s ({gate.refresh_s:g}s), got {gate.max_load_age_s:g}s:"
                " every engine report would be stale before the next one arrives")
    return gate


def _engine_cost(f: Fields, value: Any, path: Path) -> EngineCost:
    raw = f.mapping(value, path, ENGINE_COST_KEYS)
    d = EngineCost()
    transfer_ms = f.optional(raw, "transfer_fixed_ms", path,
                             lambda v, p: f.number(v, p, 0.0, 60_000.0),
                             d.transfer_fixed_s * 1000)
    return EngineCost(
        prefill_tokens_per_s=f.optional(raw, "prefill_tokens_per_s", path,
                                        lambda v, p: f.number(v, p, 1.0, 1e9),
                                        d.prefill_tokens_per_s),
        prefill_overhead_s=f.optional(raw, "prefill_overhead_s", path,
                                      lambda v, p: f.duration(v, p, 0.0, 600.0),
                                      d.prefill_overhead_s),
        kv_bytes_per_token=f.optional(raw, "kv_bytes_per_token", path,
                                      lambda v, p: f.size(v, p, 1, 1 << 30),
                                      d.kv_bytes_per_token),
        ddr_gbps=f.optional(raw, "ddr_gbps", path, lambda v, p: f.number(v, p, 0.001, 1e6),
                            d.ddr_gbps),
        transfer_fixed_s=transfer_ms / 1000,
    )


def _boolean(f: Fields, value: Any, path: Path) -> bool | None:
    if isinstance(value, bool):
        return value
    f.error(path, f"must be true or false, got {value!r}")
    return None
