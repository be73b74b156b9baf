"""`kvgate plan`: one workload through fleets of several sizes, and the smallest that meets a
TTFT goal. Each fleet is a `kvgate simulate` run of one routing mode; with `--pd`, each fleet
size is tried at several prefill:decode splits of one P/D mode (`simulator.pd_plan`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchkit.fleet_options import add_fleet_arguments, emulator_options, float_list
from benchkit.inputs import InputError, engines_and_workload
from emulator.options import EmulatorOptions
from kvgate.config.sections.disaggregation import DEFAULT_SKIP_PREFILL_BELOW
from kvgate.contract.modes import PdMode, RoutingMode
from simulator.command import (
    add_router_arguments,
    check_run_flags,
    hashed,
    router_description,
    router_settings,
)
from simulator.parallel import Mode, simulate_runs
from simulator.pd_flags import parse_split
from simulator.pd_plan import best_split, check_shares, markdown_pd_plan, splits
from simulator.plan import Goal, cheapest, fleets, markdown_plan
from simulator.run import SimConfig
from workload.bank import BankCodingOptions
from workload.cli import add_workload_arguments
from workload.model import Workload

TIB = 1024**4


def plan_mode(text: str) -> RoutingMode | PdMode:
    """`--mode`: a colocated routing mode, or a P/D mode (with --pd)."""
    for kind in (RoutingMode, PdMode):
        try:
            return kind(text)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(
        f"unknown mode {text!r} (choose from {', '.join([*RoutingMode, *PdMode])})")


def split_list(text: str) -> list[tuple[int, int]]:
    """`--splits 2:6,4:4`."""
    return [parse_split(part.strip()) for part in text.split(",") if part.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser)
    add_fleet_arguments(parser, 0, lists=True)
    a = parser.add_argument
    a("--mode", type=plan_mode, metavar="MODE",
      help=f"routing mode of every fleet ({RoutingMode.AFFINITY_DDR}; with --pd one of "
           f"{', '.join(PdMode)}, default {PdMode.KVGATE})")
    a("--ttft-p99", type=float, default=10.0, metavar="S",
      help="goal: TTFT p99 at most S emulated seconds (%(default)s)")
    a("--itl-p99", type=float, metavar="S",
      help="goal: inter-token latency p99 at most S emulated seconds (none by default)")
    a("--min-hit-rate", type=float, default=0.0, metavar="F",
      help="goal: prefix-cache hit rate at least F, 0..1 (%(default)s)")
    a("--load-factor", type=float, default=1.25, help="kvgate bounded load (%(default)s)")
    pd = parser.add_argument_group("prefill/decode fleets (--pd)")
    pd.add_argument("--pd", action="store_true",
                    help="plan P/D fleets: each --engines size split into prefill and decode "
                         "engines (the first P prefill, as `kvgate simulate --pd P:D`)")
    pd.add_argument("--prefill-shares", type=float_list, metavar="F,...",
                    help="the splits tried: each size's prefill engines are F x engines, "
                         "rounded, at least 1 on each side (0.25,0.5)")
    pd.add_argument("--splits", type=split_list, metavar="P:D,...",
                    help="the splits tried, instead of --prefill-shares (each P + D one of "
                         "--engines)")
    pd.add_argument("--skip-prefill-below", type=int, default=DEFAULT_SKIP_PREFILL_BELOW,
                    metavar="TOKENS", help="pd-kvgate: a turn goes to a prefill engine only "
                    "when its decode engine lacks at least this many tokens (%(default)s)")
    add_router_arguments(parser)
    a("--out", type=Path, help="write <name>.json and .md here")
    a("--name", help="output file stem (default plan-<workload>, with --pd plan-pd-<workload>)")
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


def _check_mode(args: argparse.Namespace) -> None:
    """The mode and the P/D flags agree; the mode defaults by --pd."""
    if args.mode is None:
        args.mode = PdMode.KVGATE if args.pd else RoutingMode.AFFINITY_DDR
    if args.pd:
        if not isinstance(args.mode, PdMode):
            raise InputError(f"--pd plans a P/D mode ({', '.join(PdMode)}), not {args.mode}")
        if args.prefill_shares and args.splits:
            raise InputError("give --prefill-shares or --splits, not both")
        check_shares(args.prefill_shares or ())
        for flag in ("ddr_tokens", "node_gbps"):
            if len(getattr(args, flag) or ()) > 1:
                raise InputError(f"--pd tries one --{flag.replace('_', '-')} value, got "
                                 f"{len(getattr(args, flag))}")
        if args.skip_prefill_below < 0:
            raise InputError(f"--skip-prefill-below must be >= 0, got "
                             f"{args.skip_prefill_below}")
        return
    if isinstance(args.mode, PdMode):
        raise InputError(f"mode {args.mode} needs --pd")
    for flag in ("prefill_shares", "splits"):
        if getattr(args, flag) is not None:
            raise InputError(f"--{flag.replace('_', '-')} needs --pd")


def _inputs(args: argparse.Namespace) -> tuple[list[EmulatorOptions], Workload]:
    """Every fleet's options and the workload, the flags checked before anything runs."""
    if args.sessions is None:  # the load is the user's, not a function of the fleet tried
        args.sessions = BankCodingOptions().sessions
    if not args.ttft_p99 > 0:
        raise InputError(f"--ttft-p99 must be > 0, got {args.ttft_p99:g}")
    if args.itl_p99 is not None and not args.itl_p99 > 0:
        raise InputError(f"--itl-p99 must be > 0, got {args.itl_p99:g}")
    if not 0 <= args.min_hit_rate <= 1:
        raise InputError(f"--min-hit-rate must be in [0, 1], got {args.min_hit_rate:g}")
    _check_mode(args)
    check_run_flags(args)
    options = _fleet_options(args)
    first = argparse.Namespace(**{**vars(args), "engines": options[0].instances,
                                  "ddr_tokens": options[0].ddr_tokens,
                                  "node_gbps": options[0].node_gbps})
    _, workload = engines_and_workload(first)
    return options, workload


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        options, workload = _inputs(args)
        split = (splits(args.engines, args.prefill_shares, args.splits) if args.pd else [])
    except (InputError, ValueError) as exc:
        print(f"kvgate plan: {exc}", file=sys.stderr)
        return 2
    goal = Goal(args.ttft_p99, args.min_hit_rate, args.itl_p99)
    tried = f"{len(split)} P/D splits" if args.pd else f"{len(options)} fleets"
    print(f"workload {workload.name}: {len(workload.requests)} requests; {tried} in mode "
          f"{args.mode}, goal {goal.describe()}", file=sys.stderr, flush=True)
    if args.pd:
        document = _plan_pd(args, workload, options, split, goal)
        table = markdown_pd_plan(document)
    else:
        document = _plan_colocated(args, workload, options, goal)
        table = markdown_plan(document)
    print(table)
    print(f"planned in {time.perf_counter() - started:.1f} s wall", file=sys.stderr)
    if args.out is not None:
        _write(args, workload, document, table)
    return 0 if document["cheapest"] is not None else 1


def _plan_colocated(args: argparse.Namespace, workload: Workload,
                    options: list[EmulatorOptions], goal: Goal) -> dict[str, Any]:
    blocks = hashed(workload, options[0].block_size, args.jobs)
    runs: list[tuple[Mode, SimConfig]] = [
        (args.mode, SimConfig(o, args.load_factor, **router_settings(args))) for o in options]

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
    return {"workload": _workload(workload, options[0], runs[0][1]), "mode": str(args.mode),
            "goal": goal.document(), "fleets": rows, "cheapest": cheapest(rows)}


def _plan_pd(args: argparse.Namespace, workload: Workload, options: list[EmulatorOptions],
             split: list[tuple[int, int]], goal: Goal) -> dict[str, Any]:
    """Each split a `kvgate simulate --pd P:D` run of the mode on its fleet size's options."""
    by_size = {o.instances: o for o in options}
    blocks = hashed(workload, options[0].block_size, args.jobs)
    runs: list[tuple[Mode, SimConfig]] = [
        (args.mode, SimConfig(by_size[p + d], args.load_factor, pd=(p, d),
                              skip_prefill_below=args.skip_prefill_below,
                              **router_settings(args))) for p, d in split]

    def done(index: int, seconds: float) -> None:
        p, d = split[index]
        print(f"  {p}:{d}: {seconds:.1f} s", file=sys.stderr, flush=True)

    results = simulate_runs(workload, runs, args.jobs, blocks, on_done=done)
    rows = []
    for (p, d), (stats, _) in zip(split, results, strict=True):
        o, figures = by_size[p + d], stats.figures()
        rows.append({"engines": p + d, "prefill_engines": p, "decode_engines": d,
                     "hbm_tokens": o.hbm_tokens, "ddr_tokens": o.pool_tokens,
                     "node_gbps": o.node_gbps, **figures, "meets_goal": goal.met_by(figures)})
    described = {**_workload(workload, options[0], runs[0][1]),
                 "skip_prefill_below": args.skip_prefill_below,
                 "link_gbps": options[0].ddr_gbps,
                 "link_fixed_ms": options[0].transfer_fixed_ms}
    return {"workload": described, "mode": str(args.mode), "goal": goal.document(),
            "fleets": rows, "cheapest": best_split(rows, goal)}


def _workload(workload: Workload, options: EmulatorOptions, config: SimConfig
              ) -> dict[str, Any]:
    return {**workload.describe, "block_size": options.block_size,
            "pool_connector": options.pool_connector, **router_description(config),
            "tool": "kvgate plan"}


def _write(args: argparse.Namespace, workload: Workload, document: Mapping[str, Any],
           table: str) -> None:
    name = args.name or f"plan-{'pd-' if args.pd else ''}{workload.name}"
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / f"{name}.json", args.out / f"{name}.md"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    md_path.write_text(f"# kvgate plan: {workload.name}, {len(workload.requests)} "
                       f"requests, mode {args.mode}\n\n{table}")
    for path in (json_path, md_path):
        print(f"wrote {path}", file=sys.stderr)
