"""`kvgate bench --compare`: per routing mode, a fresh emulated fleet and gateway (`Stack`), the
same workload through it, then everything stopped."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.client import DriveOptions, DriveResult, drive
from benchkit.fleet_options import emulator_flags
from benchkit.modes import ALL_MODES
from emulator.options import EmulatorOptions
from kvgate.config import Config, load_text
from kvgate.contract.modes import RoutingMode
from kvgate.runtime.children.ports import NoFreePorts, PortRange, ReservedPorts, free_run
from stack.engine_speed import for_emulated_fleet
from stack.local import Stack
from workload.model import Workload


@dataclass(frozen=True, slots=True)
class CompareOptions:
    engine: EmulatorOptions  # instances, block size, HBM, ... and time_scale
    workdir: Path
    progress: bool = False
    header: str = "x-session-id"
    port_range: PortRange | None = None  # every port the run listens on from here (shared hosts)
    session_in: str = "header"  # where the bench puts the session id (see bench.client)
    extra_headers: tuple[tuple[str, str], ...] = ()
    # `scrape`: each ext_proc replica reads the engines' /metrics; `collector`: the control
    # plane's collector does, and reads each engine's KV cache events (HBM residency)
    fleet_source: str = "scrape"
    # The gate's prefix step (`placement.load_gate.prefix_placement`): ext_proc reads the
    # prompts of new sessions and places them where their leading blocks are held
    prefix_placement: bool = False


BENCH_BYTES_PER_TOKEN = 5.3  # the bench's request bodies per prompt token (bench/prompt_size.py)
GATEWAY_PORTS = 6  # listener, Envoy admin, xDS, admin API, ext_proc, ext_proc metrics
OTHER_PORTS = 1 + GATEWAY_PORTS + 2  # + the DDR pool, + the embedded etcd's client and peer


def ports_needed(engines: int, fleet_source: str = "scrape") -> int:
    """How many ports a comparison on ``engines`` engines listens on: with the collector, each
    engine also publishes KV cache events and serves their replay."""
    return engines * (3 if fleet_source == "collector" else 1) + OTHER_PORTS


@dataclass(frozen=True, slots=True)
class RunPorts:
    """Every port a comparison listens on, the same in every mode: the engine addresses must not
    change between modes (the rings place sessions by address, and the simulator reproduces a
    run from them)."""

    engines: tuple[int, ...]
    pool: int
    gateway: tuple[int, ...]  # GATEWAY_PORTS of them, in the order above
    etcd: tuple[int, int]
    # With the collector: engine i publishes its KV events on events + i and serves their
    # replay on replay + i; the engines are then consecutive, so that one offset from an
    # engine's port finds its stream (`kv_events_port_offset`, kvgate.fleet.kv_events).
    events: int = 0
    replay: int = 0

    @classmethod
    def of(cls, engines: int, ports: Sequence[int]) -> RunPorts:
        rest = iter(ports[engines:])
        return cls(tuple(ports[:engines]), next(rest),
                   tuple(next(rest) for _ in range(GATEWAY_PORTS)), (next(rest), next(rest)))

    @classmethod
    def with_events(cls, engines: int, run: int, others: Sequence[int]) -> RunPorts:
        """The engines on ``run``, ``run`` + 1, ...; their event streams and replay sockets on
        the two runs after; the other ports from ``others``."""
        ports = cls.of(0, others)
        return replace(ports, engines=tuple(range(run, run + engines)),
                       events=run + engines, replay=run + 2 * engines)


def gateway_config(header: str, ports: RunPorts, fleet_source: str = "scrape",
                   prefix_placement: bool = False) -> Config:
    """No pools, so the Stack starts the emulated fleet itself; ext_proc (or the collector)
    reads the engines every 500 ms and sizes prompts at the bench's bytes per token (stack_for
    says why); with the collector, it reads each engine's own KV event stream too; with
    `prefix_placement`, the gate's prefix step is on."""
    settings = gateway_settings(header, ports.gateway)
    gate: dict[str, Any] = {"refresh_s": 0.5, "bytes_per_token": BENCH_BYTES_PER_TOKEN,
                            **({"prefix_placement": True} if prefix_placement else {})}
    if fleet_source == "collector":
        gate |= {"source": "collector",
                 "kv_events_port_offset": ports.events - ports.engines[0],
                 "kv_events_replay_offset": ports.replay - ports.events}
    settings["placement"] = {"load_gate": gate}
    return load_text(json.dumps(settings), require_pools=False)


def gateway_settings(header: str, ports: Sequence[int]) -> dict[str, Any]:
    """A gateway's config on loopback: its six ports (listener, Envoy admin, xDS, admin API,
    ext_proc, ext_proc's metrics) and the session header; no pools (the caller adds them)."""
    listener, admin, xds, api, ext_proc, metrics = ports
    return {
        "listener": {"port": listener},
        "envoy_admin": {"port": admin},
        "control_plane": {"xds": f"127.0.0.1:{xds}", "admin": f"127.0.0.1:{api}"},
        "ext_proc": {"address": [f"127.0.0.1:{ext_proc}"], "metrics": f"127.0.0.1:{metrics}"},
        "session": {"headers": [header]},
    }


def stack_for(mode: RoutingMode, options: CompareOptions, ports: RunPorts) -> Stack:
    """The gateway in ``mode`` with its own emulated fleet on ``ports``."""
    engine = options.engine
    args = ("--time-scale", repr(engine.time_scale),
            "--ports", ",".join(map(str, ports.engines)), "--pool-port", str(ports.pool),
            *emulator_flags(engine))
    if not mode.ddr_pool:
        args = (*args, "--no-ddr-pool")
    if engine.processes > 1:
        args = (*args, "--processes", str(engine.processes))
    if ports.events:  # every mode's engines publish (the same work), only the gate reads them
        args = (*args, "--kv-events-port", str(ports.events),
                "--kv-events-replay-port", str(ports.replay))
    # ext_proc prices requests with the emulated engines' own figures; the gate is on only in
    # the load-aware modes (sticky+ddr is kvgate with it off). Its one replica's ledger knows
    # every request sent, so the scrapes (which would show other routers' traffic) only cost
    # the emulator CPU here, which it counts as engine time: every 500 ms wall. The bench's
    # prompts are 5.3 body bytes per token (bench/prompt_size.py).
    config = gateway_config(options.header, ports, options.fleet_source,
                            options.prefix_placement)
    placement = for_emulated_fleet(config.placement, engine, engine.time_scale,
                                   gate_on=mode.load_aware)
    # One Envoy worker: its round robin is then one rotation over the engines, as in the
    # simulator; with two, each worker keeps its own and the kernel picks which connection
    # lands on which, so round robin's chance hits would differ from run to run.
    return Stack(replace(config, placement=placement),
                 options.workdir / str(mode).replace("+", "-"),
                 mode=mode, emulated_engines=engine.instances, emulator_args=args,
                 envoy_workers=1, etcd_ports=ports.etcd)


def check_modes(modes: Sequence[RoutingMode]) -> None:
    """Raises ValueError naming the modes a real stack cannot run (the peers' policies)."""
    simulated = [str(m) for m in modes if m.simulated_only]
    if simulated:
        raise ValueError(
            f"--modes: {', '.join(simulated)} run in `kvgate simulate` and `kvgate plan` only "
            "(the peers' policies score each prompt's blocks, which kvgate's gateway does not "
            f"see); on a real stack choose from {', '.join(ALL_MODES)}")


async def compare(workload: Workload, modes: Sequence[RoutingMode], options: CompareOptions,
                  say: Callable[[str], None] = lambda line: None) -> dict[RoutingMode, DriveResult]:
    check_modes(modes)
    results: dict[RoutingMode, DriveResult] = {}
    with reserved_ports(options) as ports:
        for mode in modes:
            results[mode] = await _run_mode(workload, mode, options, ports, say)
    return results


@contextmanager
def reserved_ports(options: CompareOptions) -> Iterator[RunPorts]:
    """Every port the comparison listens on (free ports from the OS, or from the range),
    reserved for the whole run so that nothing else on the host takes one between two modes."""
    engines = options.engine.instances
    if options.fleet_source != "collector":
        with ReservedPorts(ports_needed(engines), within=options.port_range) as reserved:
            yield RunPorts.of(engines, reserved.ports)
        return
    with ReservedPorts(OTHER_PORTS, within=options.port_range) as others:
        run = _free_run(3 * engines, others.ports, options.port_range)
        with ReservedPorts(3 * engines, within=(run, run + 3 * engines - 1)):
            yield RunPorts.with_events(engines, run, others.ports)


def _free_run(count: int, taken: Sequence[int], within: PortRange | None) -> int:
    """The first of ``count`` consecutive free ports, none in ``taken``, inside ``within`` if
    given (tried from its low end)."""
    if within is None:
        return free_run(count, exclude=taken)
    low, high = within
    for base in range(low, high - count + 2):
        try:
            return free_run(count, exclude=taken, first=base, tries=0)
        except NoFreePorts:
            continue
    raise NoFreePorts(f"no {count} consecutive free ports in {low}-{high} for the engines, "
                      "their KV event streams and replay sockets")


async def _run_mode(workload: Workload, mode: RoutingMode, options: CompareOptions, ports: RunPorts,
                    say: Callable[[str], None]) -> DriveResult:
    stack = stack_for(mode, options, ports)
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
        result = await drive(workload, drive_options)
        result.endpoints = [e.key for e in pool.endpoints]
    finally:
        await stack.stop()
    say(f"{mode}: {result.stats.figures()['requests']} measured requests, "
        f"{result.stats.errors} errors, engines used {len(result.engines)}, "
        f"worst send lateness {result.late_s * 1000:.0f} ms wall")
    return result
