"""The emulated half of a calibration: the workloads through emulated engines timed by each
model's fits, compared with the real runs. ``python -m real_vllm calibrate`` runs it after the
real half; ``python -m real_vllm calibrate --replay DIR`` runs it alone against what an earlier
``calibrate --out DIR`` stored (its real figures, samples and workload description), starting
no real engine, so a new timing model can be checked against committed real runs.

Backends: ``live`` (default) is what ``calibrate`` does, the workload through kvgate's gateway
in front of an emulated fleet in real time; ``sim`` is kvgate's discrete-event simulator over
the same engine model (seconds instead of minutes, no wall-clock noise; its gateway is the
simulated one, so round robin's interleaving can differ).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from real_vllm.calibrate import (
    Sample,
    Timing,
    calibration_workload,
    emulated,
    fits,
    run_emulated,
)
from real_vllm.direct import run_emulated_direct
from real_vllm.fleet import EngineOptions
from real_vllm.report import Runs, comparison, describe_timing, markdown, summary
from simulator.run import SimConfig, simulate_async
from workload.model import Workload

BACKENDS = ("live", "sim")
Say = Callable[[str], None]


async def emulate_once(options: EmulatorOptions, workload: Workload,
                       modes: Sequence[RoutingMode], workdir: Path, backend: str,
                       say: Say, route: str = "gateway") -> dict[str, dict[str, Any]]:
    """One run per mode; each mode's figures. ``route``: through the gateway, or ``direct``
    (the client routing, real_vllm.direct)."""
    if route == "direct":  # (live only: replay refuses a simulated direct run)
        direct = await run_emulated_direct(options, workload, modes, workdir, say)
        return {str(m): r.stats.figures() for m, r in direct.items()}
    if backend == "sim":
        out = {}
        for mode in modes:
            result = await simulate_async(workload, mode, SimConfig(engine=options))
            out[str(mode)] = result.stats.figures()
        return out
    results = await run_emulated(options, workload, modes, workdir, say)
    return {str(m): r.stats.figures() for m, r in results.items()}


async def emulated_half(
    workloads: Mapping[str, Workload], real: Mapping[str, Runs],
    timings: Mapping[str, Mapping[str, Timing]], modes: Sequence[RoutingMode],
    engine: tuple[int, int, int], workdir: Path, say: Say, backend: str = "live",
    repeats: int = 1, route: str = "gateway",
) -> dict[str, list[dict[str, Any]]]:
    """Per workload (``a``, ``b``): rows comparing its real runs with emulated ones, for each
    timing model of ``timings[workload]`` (model -> fit). ``engine``: instances, KV tokens
    per engine, max_num_seqs."""
    instances, kv_tokens, max_num_seqs = engine
    rows: dict[str, list[dict[str, Any]]] = {}
    for name, workload in workloads.items():
        rows[name] = []
        for model, timing in timings[name].items():
            options = emulated(instances, timing, kv_tokens, max_num_seqs)
            runs: Runs = {}
            for r in range(repeats):
                say(f"emulated {name} [{model}] {r + 1}/{repeats} ({backend})")
                once = await emulate_once(options, workload, modes,
                                          workdir / f"e{name}-{model}-{r}", backend, say, route)
                for mode, figures in once.items():
                    runs.setdefault(mode, []).append(figures)
            rows[name] += comparison(dict(real[name]), runs, model)
    return rows


def tables(rows: Mapping[str, Sequence[dict[str, Any]]],
           idle: Mapping[str, Timing], loaded: Mapping[str, Timing]) -> str:
    """Both workloads' tables, each fit named, and the count of comparisons within target."""
    def fitted(name: str, by_model: Mapping[str, Timing]) -> str:
        return "; ".join(describe_timing(name, t) for t in by_model.values())

    return "\n".join([
        markdown(f"workload A (seed 3), emulator with the idle fits; {fitted('idle fit', idle)}",
                 rows["a"]),
        markdown(f"workload B (seed 4), emulator with the in-workload fits from A's real run; "
                 f"{fitted('in-workload fit', loaded)}", rows["b"]),
        f"Within target, both workloads: {summary([*rows['a'], *rows['b']])}.",
    ]) + "\n"


def stored_runs(section: Mapping[str, Any]) -> Runs:
    """The real figures per mode of a stored workload section (every repeat when stored)."""
    runs: Runs = {}
    for row in section["modes"]:
        runs.setdefault(row["mode"], row.get("real_runs") or [row["real"]])
    return runs


def stored_samples(records: Sequence[Mapping[str, Any]]) -> list[Sample]:
    return [Sample(**record) for record in records]


def stored_workloads(describe: Mapping[str, Any]) -> dict[str, Workload]:
    """Workloads A and B exactly as the stored run built them."""
    seeds, decode = describe["seeds"], describe["decode_s_per_token"]
    return {name: calibration_workload(seed=seeds[name], sessions=describe["sessions"],
                                       decode_s_per_token=decode) for name in ("a", "b")}


async def replay(directory: Path, models: Sequence[str], workdir: Path, say: Say,
                 backend: str = "live", repeats: int = 1,
                 prompt_term: bool | None = None) -> dict[str, Any]:
    """The emulated half against ``directory``'s stored real half, with fits made again from
    its stored samples for each of ``models`` (``prompt_term``: with the per-prompt-token
    term or without; None: as the stored fits were made)."""
    data = json.loads((directory / "calibration.json").read_text())
    describe = data["describe"]
    # A run routed by the client is replayed the same way (runs before --route: the gateway).
    route = describe.get("route", "gateway")
    if route == "direct" and backend != "live":
        raise ValueError(f"{directory}: its real half was routed by the client (--route "
                         "direct), which only the live emulator can replay; not --backend "
                         f"{backend} (the simulator has its own gateway)")
    # By default fitted as the stored run was: with the per-prompt-token term only if its fits
    # had it.
    stored_fit = next(iter((data.get("idle_fits") or {"": data["idle_fit"]}).values()))
    term = "prompt_us_per_token" in stored_fit if prompt_term is None else prompt_term
    idle = fits(stored_samples(data["idle_samples"]), models, term)
    loaded = fits(stored_samples([s for by_mode in data["workload_a_samples"].values()
                                  for s in by_mode]), models, term)
    for name, by_model in (("idle fit", idle), ("in-workload fit", loaded)):
        for timing in by_model.values():
            say(describe_timing(name, timing))
    real = {"a": stored_runs(data["workload_a"]), "b": stored_runs(data["workload_b"])}
    modes = [RoutingMode(m) for m in real["a"]]
    engine = (describe["engines"], describe["kv_tokens_per_engine"], EngineOptions.max_num_seqs)
    rows = await emulated_half(stored_workloads(describe), real, {"a": idle, "b": loaded},
                               modes, engine, workdir, say, backend, repeats, route)
    return {
        "replayed": str(directory), "backend": backend, "repeats": repeats, "route": route,
        "prompt_term": term,
        "idle_fits": {m: asdict(t) for m, t in idle.items()},
        "in_workload_fits": {m: asdict(t) for m, t in loaded.items()},
        "workload_a": {"emulator_timing": "idle_fit", "modes": rows["a"]},
        "workload_b": {"emulator_timing": "in_workload_fit", "modes": rows["b"]},
        "markdown": tables(rows, idle, loaded),
    }
