"""`kvgate up`: etcd, control plane, ext_proc and Envoy on this machine, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path

from kvgate.config import Config, ConfigError, load_file
from kvgate.runtime.child import ChildFailed
from kvgate.up.stack import Stack


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="kvgate YAML file (default: built-in defaults)")
    parser.add_argument(
        "--workdir", help="where logs, rendered configs and embedded etcd data go "
        "(default: a new temporary directory)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = load_file(args.config) if args.config else Config()
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print("kvgate up: configuration rejected; nothing was started", file=sys.stderr)
        return 1
    if not config.pools:
        print("kvgate up: pools: no engines configured; list them in the YAML", file=sys.stderr)
        return 1
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kvgate-up-"))
    return asyncio.run(_up(config, workdir))


def _say(line: str) -> None:
    print(line, flush=True)


async def _up(config: Config, workdir: Path) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stack = Stack(config, workdir, report=_say)
    _say(f"kvgate up: starting (logs in {workdir})")
    starting = asyncio.create_task(stack.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # Ctrl-C while starting: stop what is up, then leave
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await stack.stop()
        _say("kvgate up: interrupted; everything stopped")
        return 130
    stopping.cancel()
    try:
        starting.result()
    except ChildFailed as exc:
        print(f"kvgate up: {exc}", file=sys.stderr)
        print("kvgate up: nothing left running", file=sys.stderr)
        return 1
    _print_ready(stack)
    died = await _wait_for_stop_or_death(stack, stop)
    await stack.stop()
    if died:
        print(f"kvgate up: {died} exited unexpectedly; everything stopped", file=sys.stderr)
        return 1
    _say("kvgate up: stopped")
    return 0


def _print_ready(stack: Stack) -> None:
    config = stack.config
    engines = [ep.key for pool in config.pools for ep in pool.endpoints]
    _say("")
    _say(f"kvgate is ready: gateway http://{config.listener}")
    _say(f"  Envoy admin: http://{config.envoy_admin}")
    _say(f"  engines: {', '.join(engines)}")
    header = config.session.headers[0]
    _say(f"  try: curl -s http://{config.listener}/v1/models -H '{header}: demo-1'")
    _say("  Ctrl-C stops everything.")


async def _wait_for_stop_or_death(stack: Stack, stop: asyncio.Event) -> str | None:
    while not stop.is_set():
        for component in stack.components:
            if component.child is not None and not component.child.running:
                return component.name
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
    return None
