"""`kvgate plan`: one workload through fleets of several sizes, and the smallest that meets a
TTFT goal. Each fleet is a `kvgate simulate` run of one routing mode."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchkit.fleet_options import add_fleet_arguments, emulator_options
from benchkit.inputs import InputError, engines_and_workload
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from simulator.command import (
    add_router_arguments,
    check_run_flags,
    hashed,
    router_description,
    router_settings,
)
from simulator.parallel import simulate_runs
from simulator.plan import Goal, cheapest, fleets, markdown_plan
from simulator.run import SimConfig
from workload.bank import BankCodingOptions
from workload.cli import add_workload_arguments

TIB = 1024**4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser)
    add_fleet_arguments(parser, 0, lists=True)
    a = parser.add_argument
    a("--mode", type=RoutingMode, default=RoutingMode.AFFINITY_DDR, choices=list(RoutingMode),
      help="routing mode of every fleet (%(default)s)")
    a("--ttft-p99", type=float, default=10.0, metavar="S",
      help="goal: TTFT p99 at most S emulated seconds (%(default)s)")
    a("--min-hit-rate", type=float, default=0.0, metavar="F",
      help="goal: prefix-cache hit rate at least F, 0..1 (%(default)s)")
    a("--load-factor", type=float, default=1.25, help="kvgate bounded load (%(default)s)")
    add_router_arguments(parser)
    a("--out", type=Path, help="write <name>.json and .md here")
    a("--name", help="output file stem (default plan-<workload>)")
    a("--jobs", type=int, default=min(4, os.cpu_count() or 1),
      help="fleets simulated in parallel processes (%(default)s)")


def _fleet_options(args: argparse.Namespace) -> list[EmulatorOptions]:
    """Every fleet's engine options, each checked (its flag named) before anything runs."""
    pooled = args.mode.ddr_pool
    tried = fleets(args.engines, args.ddr_tokens if pooled else None,
                   args.node_gbps if pooled else None)
    return [emulator_options(argparse.Namespace(**{
        **vars(args), "engines": f.engines, "ddr_tokens": f.ddr_tokens,
        "node_gbps": f.node_gbps if f.node_gbps is not None else args.node_gbps[0]}))
            for f in tried]


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.sessions is None:  # the load is the user's, not a function of the fleet tried
        args.sessions = BankCodingOptions().sessions
    try:
        if not args.ttft_p99 > 0:
            raise InputError(f"--ttft-p99 must be > 0, got {args.ttft_p99:g}")
        if not 0 <= args.min_hit_rate <= 1:
            raise InputError(f"--min-hit-rate must be in [0, 1], got {args.min_hit_rate:g}")
        check_run_flags(args)
        options = _fleet_options(args)
        first = argparse.Namespace(**{**vars(args), "engines": options[0].instances,
                                      "ddr_tokens": options[0].ddr_tokens,
                                      "node_gbps": options[0].node_gbps})
        _, workload = engines_and_workload(first)
    except (InputError, ValueError) as exc:
        print(f"kvgate plan: {exc}", file=sys.stderr)
        return 2
    goal = Goal(args.ttft_p99, args.min_hit_rate)
    print(f"workload {workload.name}: {len(workload.requests)} requests; {len(options)} fleets "
          f"in mode {args.mode}, goal {goal.describe()}", file=sys.stderr, flush=True)
    blocks = hashed(workload, options[0].block_size, args.jobs)
    runs = [(args.mode, SimConfig(o, args.load_factor, **router_settings(args)))
            for o in options]

    def done(index: int, seconds: float) -> None:
        o = options[index]
        print(f"  {o.instances} engines, DDR pool {o.pool_tokens} tokens, node link "
              f"{o.node_gbps:g} GB/s: {seconds:.1f} s", file=sys.stderr, flush=True)

    results = simulate_runs(workload, runs, args.jobs, blocks, on_done=done)
    rows = []
    for o, (stats, _) in zip(options, results, strict=True):
        figures = stats.figures()
        rows.append({"engines": o.instances, "hbm_tokens": o.hbm_tokens,
                     "ddr_tokens": o.pool_tokens,
                     "ddr_tib": o.pool_tokens * o.kv_bytes_per_token / TIB,
                     "node_gbps": o.node_gbps,
                     **figures, "meets_goal": goal.met_by(figures)})
    document = {"workload": {**workload.describe, "block_size": options[0].block_size,
                             "pool_connector": options[0].pool_connector,
                             **router_description(runs[0][1]), "tool": "kvgate plan"},
                "mode": str(args.mode),
                "goal": {"ttft_p99_s": goal.ttft_p99_s, "min_hit_rate": goal.min_hit_rate,
                         "text": goal.describe()},
                "fleets": rows, "cheapest": cheapest(rows)}
    table = markdown_plan(document)
    print(table)
    print(f"planned in {time.perf_counter() - started:.1f} s wall", file=sys.stderr)
    if args.out is not None:
        name = args.name or f"plan-{workload.name}"
        args.out.mkdir(parents=True, exist_ok=True)
        json_path, md_path = args.out / f"{name}.json", args.out / f"{name}.md"
        json_path.write_text(json.dumps(document, indent=2) + "\n")
        md_path.write_text(f"# kvgate plan: {workload.name}, {len(workload.requests)} "
                           f"requests, mode {args.mode}\n\n{table}")
        for path in (json_path, md_path):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if document["cheapest"] is not None else 1
