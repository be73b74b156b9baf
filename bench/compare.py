"""`kvgate bench --compare`: per routing mode, a fresh emulated fleet and gateway (`Stack`), the
same workload through it, then everything stopped."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.client import DriveOptions, DriveResult, drive
from bench.fleet_options import emulator_flags
from bench.modes import Mode
from control_plane.resources.names import RoutingMode
from emulator.options import EmulatorOptions
from kvgate.config import Config, load_text
from kvgate.runtime.ports import free_ports, port_in_use
from kvgate.up.stack import Stack
from workload.model import Workload

_ROUTING = {
    Mode.ROUND_ROBIN: RoutingMode.ROUND_ROBIN,
    Mode.RING_HASH: RoutingMode.RING_HASH,
    Mode.AFFINITY: RoutingMode.AFFINITY,
    Mode.AFFINITY_DDR: RoutingMode.AFFINITY,
}


@dataclass(frozen=True, slots=True)
class CompareOptions:
    engine: EmulatorOptions  # instances, block size, HBM, ... and time_scale
    workdir: Path
    progress: bool = False
    header: str = "x-session-id"
    session_in: str = "header"  # where the bench puts the session id (see bench.client)
    extra_headers: tuple[tuple[str, str], ...] = ()


def gateway_config(header: str) -> Config:
    """Every port free; no pools, so the Stack starts the emulated fleet itself."""
    listener, admin, xds, api, ext_proc, metrics = free_ports(6)
    return load_text(json.dumps({
        "listener": {"port": listener},
        "envoy_admin": {"port": admin},
        "control_plane": {"xds": f"127.0.0.1:{xds}", "admin": f"127.0.0.1:{api}"},
        "ext_proc": {"address": [f"127.0.0.1:{ext_proc}"], "metrics": f"127.0.0.1:{metrics}"},
        "session": {"headers": [header]},
    }))


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """First of ``count`` consecutive free ports, below Linux's ephemeral range."""
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20000, 32000 - count)
        if not any(port_in_use(host, base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def stack_for(mode: Mode, options: CompareOptions, base_port: int) -> Stack:
    """The gateway in ``mode`` with its own emulated fleet on ``base_port``.. (the same engine
    addresses in every mode, so the rings place sessions alike and the simulator can match)."""
    engine = options.engine
    args = ("--time-scale", repr(engine.time_scale), "--port", str(base_port),
            *emulator_flags(engine))
    if not mode.ddr_pool:
        args = (*args, "--no-ddr-pool")
    # One Envoy worker: its round robin is then one rotation over the engines, as in the
    # simulator; with two, each worker keeps its own and the kernel picks which connection
    # lands on which, so round robin's chance hits would differ from run to run.
    return Stack(gateway_config(options.header), options.workdir / str(mode).replace("+", "-"),
                 mode=_ROUTING[mode], emulated_engines=engine.instances, emulator_args=args,
                 envoy_workers=1)


async def compare(workload: Workload, modes: Sequence[Mode], options: CompareOptions,
                  say: Callable[[str], None] = lambda line: None) -> dict[Mode, DriveResult]:
    results: dict[Mode, DriveResult] = {}
    base_port = free_port_run(options.engine.instances)
    for mode in modes:
        stack = stack_for(mode, options, base_port)
        say(f"{mode}: starting {options.engine.instances} engines and the gateway")
        await stack.start()
        try:
            pool = stack.config.pools[0]
            drive_options = DriveOptions(
                url=f"http://{stack.config.listener}", time_scale=options.engine.time_scale,
                header=options.header, engines=[f"http://{e.key}" for e in pool.endpoints],
                progress=options.progress, label=str(mode), session_in=options.session_in,
                extra_headers=options.extra_headers,
            )
            results[mode] = await drive(workload, drive_options)
            results[mode].endpoints = [e.key for e in pool.endpoints]
        finally:
            await stack.stop()
        r = results[mode]
        say(f"{mode}: {r.stats.figures()['requests']} measured requests, "
            f"{r.stats.errors} errors, engines used {len(r.engines)}, "
            f"worst send lateness {r.late_s * 1000:.0f} ms wall")
    return results
