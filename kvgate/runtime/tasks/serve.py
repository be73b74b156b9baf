"""Run a service until SIGINT/SIGTERM: build and start it (or report why not), wait, stop with
grace."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from collections.abc import Callable
from typing import Protocol, TypeVar

from kvgate.config.flags import load_or_report
from kvgate.config.model import Config
from kvgate.observability.logs import configure_logging
from kvgate.runtime.tasks.loop import run as run_loop


class Service(Protocol):
    """What every kvgate service offers its runner."""

    async def start(self) -> None: ...

    async def stop(self, grace: float = ...) -> None: ...


S = TypeVar("S", bound=Service)


def command_config(args: argparse.Namespace) -> Config | None:
    """A service command's start: its logs at --log-level, then its config from --config (None
    once every problem is printed to stderr)."""
    configure_logging(args.log_level)
    return load_or_report(args.config)


def serve_command(
    name: str, build: Callable[[], S], refused: tuple[type[Exception], ...],
    on_hangup: Callable[[S], Callable[[], None]] | None = None,
) -> int:
    """A service command's end: `build` the service (an exception in `refused`: one line on
    stderr, exit 2), then serve it until signalled on kvgate's event loop, so that every kvgate
    process runs on one loop (the control plane's collector measured no faster on it:
    bench/collector_at_scale.py --loops). `on_hangup`: what SIGHUP calls, given the service."""
    try:
        service = build()
    except refused as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    hangup = None if on_hangup is None else on_hangup(service)
    return run_loop(serve_until_signalled(service, name, on_hangup=hangup))


async def serve_until_signalled(
    service: Service, name: str, on_hangup: Callable[[], None] | None = None
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if on_hangup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
    try:
        await service.start()
    except Exception as exc:  # one clear line, then undo whatever did start
        print(f"{name}: {exc}", file=sys.stderr)
        await service.stop(grace=0)
        return 1
    # What start-up made (modules, config, gRPC's and aiohttp's objects) lives as long as the
    # process: kept out of the collector's full passes, one of which over ext_proc's ~55,000
    # takes 120-140 ms of its event loop at load average 14 (docs/journal/ext-proc-grpc.md).
    gc.freeze()
    await stop.wait()
    await service.stop()
    return 0
