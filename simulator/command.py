"""`kvgate simulate`: the workload through each routing mode of a simulated fleet."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchkit.fleet_options import add_fleet_arguments
from benchkit.inputs import InputError, engines_and_workload
from benchkit.report import (
    ModeStats,
    markdown_table,
    result_document,
    write_outputs,
)
from emulator.options import EmulatorOptions
from kvgate.config.sections.placement import decision_settings
from kvgate.runtime.tasks.collector import collector_paused
from simulator.gate_flags import add_gate_flags, gate_settings
from simulator.parallel import simulate_modes
from simulator.pd_flags import add_pd_flags, check_pd, parse_modes, pd_description
from simulator.run import (
    LOAD_REFRESH_S,
    POOL_READ_ORDERS,
    PROMPT_ERROR,
    READ_ON_ARRIVAL,
    FleetEvent,
    SimConfig,
    check_read_order,
)
from workload.cli import add_workload_arguments
from workload.hashing import PromptBlocks, oracle_hits
from workload.model import Workload
from workload.profile import peak_working_set

DEFAULT_ENGINES = 16


def fleet_event(kind: str) -> Callable[[str], FleetEvent]:
    """Parser of ``ENGINE@T`` (engine index, emulated second) for --fail / --drain."""

    def parse(text: str) -> FleetEvent:
        engine, _, at = text.partition("@")
        try:
            return FleetEvent(kind, int(engine), float(at))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected ENGINE@T (e.g. 3@1200), got {text!r}") from None

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser)
    add_fleet_arguments(parser, DEFAULT_ENGINES)
    a = parser.add_argument
    a("--modes", type=parse_modes, default=parse_modes("all"),
      help="comma-separated: round_robin,ring_hash,affinity,round_robin+ddr,affinity+ddr,"
      "sticky+ddr,prefix-score,kv-cost,bounded-hash (all), and with --pd the P/D modes "
      "pd-kvgate,pd-vllm-ascend,pd-llm-d,pd-dynamo (pd: these and affinity+ddr)")
    add_pd_flags(parser)
    a("--fail", type=fleet_event("fail"), action="append", default=[], metavar="ENGINE@T",
      help="engine index ENGINE fails at emulated second T (repeatable)")
    a("--drain", type=fleet_event("drain"), action="append", default=[], metavar="ENGINE@T",
      help="engine index ENGINE is drained at emulated second T (repeatable)")
    a("--addresses", help="comma-separated engine host:port (default 10.x.y.z:8000); a real "
      "fleet's addresses reproduce its placements, e.g. a bench --compare run's endpoints")
    a("--load-factor", type=float, default=1.25, help="kvgate bounded load (%(default)s)")
    a("--pool-read-order", choices=POOL_READ_ORDERS, default=READ_ON_ARRIVAL,
      help="a request reading KV from the pool: arrival = reads from its arrival, then queues "
      "behind what was booked meanwhile; vllm = reads once its engine's scheduler reaches it, "
      "lets those behind pass while it reads, then goes first, as vLLM's scheduler does for an "
      "asynchronous load; step = reads once reached and holds the engine's prefill until it "
      "ends, as a load inside the step does; connector = vllm or step, as the pool profile's "
      "connector loads (simulator/read_order.py; %(default)s)")
    add_router_arguments(parser)
    a("--out", type=Path, help="write <name>.json, .md and .png here")
    a("--name", help="output file stem (default simulate-<workload>)")
    a("--no-oracle", action="store_true", help="skip the oracle hit rate (saves a pass)")
    a("--quiet", action="store_true", help="no progress bar")
    a("--jobs", type=int, default=min(4, os.cpu_count() or 1),
      help="modes simulated in parallel processes (%(default)s)")


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        options, workload = engines_and_workload(
            args, check=lambda engines: _check(args, engines.instances))
    except InputError as exc:
        print(f"kvgate simulate: {exc}", file=sys.stderr)
        return 2
    built = time.perf_counter()
    print(f"workload {workload.name}: {len(workload.requests)} requests over "
          f"{workload.duration:.0f} s ({built - started:.1f} s to build)", file=sys.stderr)
    addresses = [a.strip() for a in (args.addresses or "").split(",") if a.strip()]
    if addresses and len(addresses) != options.instances:
        print(f"kvgate simulate: {len(addresses)} --addresses for {options.instances} engines",
              file=sys.stderr)
        return 2
    config = SimConfig(options, args.load_factor, events=[*args.fail, *args.drain],
                       progress=not args.quiet and sys.stderr.isatty() and args.jobs <= 1,
                       addresses=addresses, pd=args.pd,
                       skip_prefill_below=args.skip_prefill_below, skip_rule=args.skip_rule,
                       decode_puts=args.pd_decode_puts == "on",
                       pool_read_order=args.pool_read_order, **router_settings(args))
    blocks = hashed(workload, options.block_size, args.jobs)
    print(f"prompts hashed into {options.block_size}-token blocks "
          f"({time.perf_counter() - built:.1f} s)", file=sys.stderr)
    oracle = _Oracle(workload, options, blocks, skip=args.no_oracle)
    finished: list[str] = []

    def done(mode: str, seconds: float) -> None:
        finished.append(mode)
        print(f"  {mode}: {seconds:.1f} s ({len(finished)}/{len(args.modes)} modes)",
              file=sys.stderr, flush=True)

    print(f"simulating {len(args.modes)} modes, {min(args.jobs, len(args.modes))} at a time",
          file=sys.stderr, flush=True)
    results = simulate_modes(workload, args.modes, config, args.jobs, blocks, oracle, done)
    stats: dict[str, ModeStats] = {mode: s for mode, (s, _) in results.items()}
    document = result_document(_describe(args, workload, options, config), stats,
                               oracle.hit_rate, oracle.no_queue)
    print(markdown_table(document))
    print(f"simulated in {time.perf_counter() - started:.1f} s wall", file=sys.stderr)
    if args.out is not None:
        title = (f"kvgate simulate: {workload.name}, {options.instances} engines, "
                 f"{len(workload.requests)} requests")
        name = args.name or f"simulate-{workload.name}"
        for path in write_outputs(args.out, name, document,
                                  {m: s.ttfts for m, s in stats.items()}, title, oracle.no_queue):
            print(f"wrote {path}", file=sys.stderr)
    return 0


class _Oracle:
    """The oracle hit rate and the no-queue bound, computed when called (in this process,
    while the workers simulate); left at 0 and empty with ``skip``."""

    def __init__(self, workload: Workload, options: EmulatorOptions, blocks: PromptBlocks,
                 skip: bool) -> None:
        self._workload, self._options, self._blocks, self._skip = workload, options, blocks, skip
        self.hit_rate = 0.0
        self.no_queue: list[float] = []

    def __call__(self) -> None:
        if self._skip:
            return
        workload, blocks = self._workload, self._blocks
        measured = [workload.measured(r) for r in workload.requests]
        hits = oracle_hits(workload.requests, self._options.block_size, blocks)
        total = sum(t for t, m in zip(blocks.tokens, measured, strict=True) if m)
        self.hit_rate = sum(h for h, m in zip(hits, measured, strict=True) if m) / (total or 1)
        self.no_queue.extend(no_queue_ttfts(workload, self._options, blocks, hits))


def _describe(args: argparse.Namespace, workload: Workload, options: EmulatorOptions,
              config: SimConfig) -> dict[str, Any]:
    """What was simulated, for the result's header."""
    describe = {**workload.describe, "engines": options.instances,
                "block_size": options.block_size, "hbm_tokens": options.hbm_tokens,
                "ddr_tokens": options.pool_tokens,
                "peak_working_set_tokens": peak_working_set(workload.requests),
                **pool_description(options),
                "fail": [vars_of(e) for e in args.fail],
                "drain": [vars_of(e) for e in args.drain], "tool": "kvgate simulate"}
    describe.update(router_description(config))
    describe.update(pd_description(config))
    if config.pool_read_order != READ_ON_ARRIVAL:  # named only when set: results keep their keys
        describe["pool_read_order"] = config.pool_read_order
    return describe


def _check(args: argparse.Namespace, engines: int) -> None:
    """The flags only this command has, before anything runs."""
    for flag, events in (("--fail", args.fail), ("--drain", args.drain)):
        for event in events:
            if not 0 <= event.engine < engines:
                raise ValueError(f"{flag} {event.engine}@{event.time:g}: no engine "
                                 f"{event.engine} (engines are 0..{engines - 1})")
            if event.time < 0:
                raise ValueError(f"{flag} {event.engine}@{event.time:g}: time must be >= 0")
    check_run_flags(args)
    check_pd(args, engines)
    check_read_order(args.pool_read_order, args.pd is not None)


def check_run_flags(args: argparse.Namespace) -> None:
    """``--load-factor``, ``--jobs`` and the routers' flags, shared with `kvgate plan`."""
    if args.load_factor < 1:
        raise ValueError(f"--load-factor must be >= 1, got {args.load_factor:g}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if not args.load_refresh_s > 0:
        raise ValueError(f"--load-refresh-s must be > 0, got {args.load_refresh_s:g}")
    if not args.prompt_estimate_error >= 0:
        raise ValueError(f"--prompt-estimate-error must be >= 0, got "
                         f"{args.prompt_estimate_error:g}")


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """What the load-aware routers see and how kvgate's load gate decides (simulate, plan)."""
    a = parser.add_argument
    a("--load-refresh-s", type=float, default=LOAD_REFRESH_S, metavar="S",
      help="the routers scrape the engines' metrics every S emulated seconds (%(default)s)")
    a("--prompt-estimate-error", type=float, default=PROMPT_ERROR, metavar="SIGMA",
      help="error of the prompt size a router estimates from content-length: lognormal "
      "sigma per session (0: exact token counts; %(default)s)")
    add_gate_flags(parser)
    a("--pool-residency", choices=["on", "off"], default="off",
      help="the gate knows what the pool holds of a session it might move (exactly, as a "
           "pool's event stream would tell it) and prices the move with that (%(default)s)")
    a("--hbm-residency", choices=["on", "off"], default="off",
      help="the gate knows what each engine's HBM holds of a session (exactly, as the engines' "
           "KV events tell it) and prices staying with that (%(default)s)")


def router_settings(args: argparse.Namespace) -> dict[str, Any]:
    """SimConfig's router fields from the flags of :func:`add_router_arguments`."""
    return {"load_refresh_s": args.load_refresh_s, "prompt_error": args.prompt_estimate_error,
            "gate": gate_settings(args),
            "pool_residency": args.pool_residency == "on",
            "hbm_residency": args.hbm_residency == "on"}


def router_description(config: SimConfig) -> dict[str, Any]:
    """The routers' settings, for a result's JSON."""
    return {"load_refresh_s": config.load_refresh_s,
            "prompt_estimate_error": config.prompt_error,
            "load_gate": decision_settings(config.gate),
            "pool_residency": config.pool_residency,
            "hbm_residency": config.hbm_residency}


def no_queue_ttfts(workload: Workload, options: EmulatorOptions, blocks: PromptBlocks,
                   hits: list[int]) -> list[float]:
    """Each measured request's TTFT alone on an engine holding everything the oracle's
    infinite cache would (``hits``, see ``oracle_hits``): c0 + the tokens it does not hold ÷
    the prefill rate."""
    requests = workload.requests
    c0 = options.prefill_overhead_ms / 1000.0
    rate = options.prefill_tokens_per_s
    per_token = options.prompt_us_per_token / 1e6
    return [c0 + blocks.tokens[i] * per_token + (blocks.tokens[i] - hits[i]) / rate
            for i, r in enumerate(requests) if workload.measured(r)]


def hashed(workload: Workload, block_size: int, jobs: int) -> PromptBlocks:
    """The prompts' blocks, and the closed loop's next turns, worked out once for every forked
    worker (in ``jobs`` processes for a large workload: a fork costs more than a small one)."""
    with collector_paused(freeze=True):  # kept for the whole run
        blocks = PromptBlocks(workload.requests, block_size,
                              jobs if len(workload.requests) >= 50_000 else 1)
        workload.next_turns()
    return blocks


def one_simulation(argv: Sequence[str], description: str
                   ) -> tuple[Workload, SimConfig, PromptBlocks]:
    """`kvgate simulate`'s flags in `argv`, for a tool that runs its simulations in this process
    (simulator.ddr_reads, simulator.rehome_sensitivity): the workload, the routers' settings
    (engines failing or drained included) and its prompts, hashed."""
    parser = argparse.ArgumentParser(description=description)
    add_arguments(parser)
    args = parser.parse_args(["--quiet", "--jobs", "1", *argv])
    options, workload = engines_and_workload(args, check=lambda engines: None)
    config = SimConfig(options, args.load_factor, events=[*args.fail, *args.drain],
                       progress=False, addresses=[], pool_read_order=args.pool_read_order,
                       **router_settings(args))
    return workload, config, hashed(workload, options.block_size, 1)


def pool_description(options: EmulatorOptions) -> dict[str, object]:
    """The pool's links, watermarks and fault windows, for a result's JSON."""
    return {"ddr_gbps": options.ddr_gbps, "node_gbps": options.node_gbps,
            "pool_gbps": options.pool_gbps, "devices_per_node": options.devices_per_node,
            "transfer_fixed_ms": options.transfer_fixed_ms,
            "pool_connector": options.pool_connector,
            "pool_profile": options.pool_profile.describe(),
            "pool_watermarks": list(options.pool_watermarks),
            "pool_fail": [w.describe() for w in options.pool_fail],
            "pool_slow": [w.describe() for w in options.pool_slow]}


def vars_of(event: FleetEvent) -> dict[str, object]:
    return {"engine": event.engine, "time": event.time}
