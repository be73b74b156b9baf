"""`kvgate bench`: the workload through a running gateway (`--gateway URL`), or through each
routing mode of an emulated fleet this command starts (`--compare`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.client import (
    SESSION_IN,
    DriveOptions,
    DriveResult,
    GatewayUnreachable,
    drive,
    redact_url,
)
from bench.compare import CompareOptions, check_modes, compare, ports_needed
from bench.extra_headers import Header, check_headers, header_names, parse_header, read_header_file
from benchkit.fleet_options import add_fleet_arguments
from benchkit.inputs import InputError, engines_and_workload
from benchkit.modes import parse_modes
from benchkit.report import markdown_table, result_document, write_outputs
from emulator.command import time_scale
from emulator.options import EmulatorOptions
from kvgate.config.sections.placement import LOAD_SOURCES as FLEET_SOURCES
from kvgate.runtime.children.child import ChildFailed
from kvgate.runtime.children.ports import NoFreePorts, PortRange, parse_port_range
from workload.cli import add_workload_arguments
from workload.hashing import oracle_hit_rate
from workload.model import Workload

DEFAULT_ENGINES = 4
DEFAULT_BLOCK_FOR_ORACLE = 16  # a real vLLM's block, when the engines' block size is unknown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--gateway", metavar="URL", help="a running OpenAI-compatible gateway")
    target.add_argument("--compare", action="store_true",
                        help="start an emulated fleet + gateway per routing mode and compare")
    add_workload_arguments(parser)
    add_fleet_arguments(parser, DEFAULT_ENGINES)
    a = parser.add_argument
    a("--time-scale", type=time_scale, default=1.0,
      help="wall seconds per emulated second: the engines' --time-scale (%(default)s; "
      "e.g. 1/30 with --compare)")
    a("--session-in", choices=SESSION_IN, default="header",
      help="where each request carries its session id: the session header, the body's "
      "prompt_cache_key, or none (the gateway's implicit sessions) (%(default)s)")
    a("--session-header", default="x-session-id", metavar="NAME",
      help="the session header, for --session-in header (%(default)s)")
    a("--header", action="append", type=parse_header, default=[], metavar="NAME:VALUE",
      dest="headers", help="an extra header sent with every request to the gateway, e.g. its "
      "API key (repeatable; only the names are recorded)")
    a("--header-file", type=Path, metavar="PATH",
      help="more extra headers, one 'NAME: VALUE' a line: keeps a secret off the command line")
    a("--model", help="model name (default: the first from /v1/models)")
    a("--engine-urls", help="--gateway: comma-separated engine URLs whose /metrics to read "
      "(cache hits split HBM/DDR, and requests per engine when no header names the engine)")
    a("--upstream-header", default="x-kvgate-upstream",
      help="--gateway: response header naming the serving engine, as the gateway's "
      "upstream_header sets it (%(default)s; the emulator's x-engine-id is read too)")
    a("--modes", type=parse_modes, default=parse_modes("all"),
      help="--compare: comma-separated modes (all)")
    a("--workdir", type=Path, help="--compare: logs and configs (default: a temporary dir)")
    a("--emulator-processes", type=int, default=1, metavar="N",
      help="--compare: spread each mode's emulated engines over N processes, so the emulator's "
      "own CPU does not add to TTFT (%(default)s)")
    a("--fleet-source", choices=FLEET_SOURCES, default="scrape",
      help="--compare: how the load-aware modes learn the engines' state: each ext_proc "
      "replica scrapes /metrics (scrape), or the control plane's collector does and also reads "
      "each engine's KV cache events, so the gate knows which sessions' blocks are in HBM "
      "(collector) (%(default)s)")
    a("--gate-prefix-placement", choices=("on", "off"), default="off",
      help="--compare: the load gate's prefix step (placement.load_gate.prefix_placement): "
      "ext_proc reads a new session's prompt and places it where its leading blocks are held, "
      "as `kvgate simulate --gate-prefix-placement` (%(default)s)")
    a("--port-range", type=_port_range, metavar="LOW-HIGH",
      help="--compare: take every port the run listens on from LOW-HIGH, e.g. on a shared host "
      "(default: free ports from the OS)")
    a("--out", type=Path, help="write <name>.json, .md and .png here")
    a("--name", help="output file stem (default bench-<workload>)")
    a("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        if args.gateway is not None:
            _check_url(args.gateway)
        headers = check_headers(
            [*args.headers, *(read_header_file(args.header_file) if args.header_file else [])],
            args.session_header if args.session_in == "header" else None)
        engine, workload = engines_and_workload(args, args.time_scale)
        engine = _with_processes(args, engine)
        _check_port_range(args, engine.instances)
        if args.compare:
            check_modes(args.modes)
        elif args.gate_prefix_placement == "on":
            raise ValueError("--gate-prefix-placement applies to --compare only (a running "
                             "gateway's is its YAML's placement.load_gate.prefix_placement)")
        elif args.fleet_source != "scrape":
            raise ValueError("--fleet-source applies to --compare only (a running gateway's "
                             "config says where its fleet state comes from)")
    except (InputError, ValueError) as exc:
        print(f"kvgate bench: {exc}", file=sys.stderr)
        return 2
    _say(f"workload {workload.name}: {len(workload.requests)} requests over "
        f"{workload.duration:.0f} emulated s ({workload.duration * args.time_scale:.0f} s wall)")
    progress = not args.quiet and sys.stderr.isatty()
    if args.compare:
        results = _run_compare(args, engine, workload, headers, progress, _say)
        block = engine.block_size
    else:
        results = _run_gateway(args, workload, headers, progress, _say)
        block = args.block_size
    if results is None:
        return 1
    fleet_size = engine.instances if args.compare else _engines_seen(args, results)
    measured = [workload.measured(r) for r in workload.requests]
    oracle = oracle_hit_rate(workload.requests, block or DEFAULT_BLOCK_FOR_ORACLE, measured)
    describe = _describe(args, workload, engine, fleet_size, block, headers)
    endpoints = next((r.endpoints for r in results.values() if r.endpoints), None)
    if endpoints:
        describe["endpoints"] = endpoints  # `kvgate simulate --addresses` reproduces placements
    stats = {str(m): r.stats for m, r in results.items()}
    document = result_document(describe, stats, oracle)
    print(markdown_table(document))
    if args.out is not None:
        title = (f"kvgate bench{' --compare' if args.compare else ''}: {workload.name}, "
                 f"{fleet_size or 'unknown'} engines, {len(workload.requests)} requests")
        name = args.name or f"bench-{workload.name}"
        for path in write_outputs(args.out, name, document,
                                  {m: s.ttfts for m, s in stats.items()}, title):
            _say(f"wrote {path}")
    return 0


def _run_compare(args: argparse.Namespace, engine: EmulatorOptions, workload: Workload,
                 headers: tuple[Header, ...], progress: bool,
                 say: Callable[[str], None]) -> dict[str, DriveResult] | None:
    """Each mode in front of its own emulated fleet; None (said why) when one cannot start."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvgate-bench-"))
    options = CompareOptions(engine, workdir, progress, header=args.session_header,
                             port_range=args.port_range, session_in=args.session_in,
                             extra_headers=headers, fleet_source=args.fleet_source,
                             prefix_placement=args.gate_prefix_placement == "on")
    try:
        compared = asyncio.run(compare(workload, args.modes, options, say))
    except (NoFreePorts, ChildFailed) as exc:
        print(f"kvgate bench: {exc}", file=sys.stderr)
        return None
    return {str(mode): result for mode, result in compared.items()}


def _run_gateway(args: argparse.Namespace, workload: Workload, headers: tuple[Header, ...],
                 progress: bool, say: Callable[[str], None]) -> dict[str, DriveResult] | None:
    """The workload against a running gateway; None (said why) when it cannot be used."""
    engines = [u.strip() for u in (args.engine_urls or "").split(",") if u.strip()]
    drive_options = DriveOptions(args.gateway.rstrip("/"), args.time_scale,
                                 args.session_header, args.model, engines, progress=progress,
                                 session_in=args.session_in,
                                 extra_headers=headers,
                                 engine_headers=(args.upstream_header.lower(), "x-engine-id"))
    try:
        results = {"gateway": asyncio.run(drive(workload, drive_options))}
    except GatewayUnreachable as exc:
        print(f"kvgate bench: cannot use the gateway: {exc}", file=sys.stderr)
        return None
    served = results["gateway"].engines
    say("requests per engine: " + (", ".join(f"{e} {n}" for e, n in sorted(served.items()))
                                   if served else "unknown (no upstream header and no "
                                   "--engine-urls)"))
    return results


def _describe(args: argparse.Namespace, workload: Workload, engine: EmulatorOptions,
              fleet_size: int | None, block: int | None,
              headers: tuple[Header, ...]) -> dict[str, Any]:
    """What was run, for the result's header."""
    return {**workload.describe, "engines": fleet_size, "block_size": block,
            "time_scale": args.time_scale, "session_in": args.session_in,
            "extra_headers": header_names(headers),  # names only: a value may be a secret
            **({"emulator_processes": engine.processes,
                "pool_connector": engine.pool_connector} if args.compare else {}),
            **({"fleet_source": args.fleet_source}
               if args.compare and args.fleet_source != "scrape" else {}),
            **({"load_gate": {"prefix_placement": True}}
               if args.compare and args.gate_prefix_placement == "on" else {}),
            "tool": "kvgate bench"
            + (" --compare" if args.compare else f" --gateway {redact_url(args.gateway)}")}


def _port_range(text: str) -> PortRange:
    try:
        return parse_port_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_port_range(args: argparse.Namespace, engines: int) -> None:
    if args.port_range is None:
        return
    if not args.compare:
        raise ValueError("--port-range applies to --compare only (the runs it starts)")
    low, high = args.port_range
    needed = ports_needed(engines, args.fleet_source)
    if high - low + 1 < needed:
        raise ValueError(f"--port-range {low}-{high} holds {high - low + 1} ports; --compare "
                         f"with {engines} engines listens on {needed}")


def _with_processes(args: argparse.Namespace, engine: EmulatorOptions) -> EmulatorOptions:
    if args.emulator_processes == 1:
        return engine
    if not args.compare:
        raise ValueError("--emulator-processes applies to --compare only (the engines it starts)")
    if not 1 <= args.emulator_processes <= engine.instances:
        raise ValueError(f"--emulator-processes must be between 1 and --engines "
                         f"({engine.instances}), got {args.emulator_processes}")
    return replace(engine, processes=args.emulator_processes)


def _engines_seen(args: argparse.Namespace, results: Mapping[str, DriveResult]) -> int | None:
    """--gateway: the engines given by URL, else those the requests were attributed to, else
    unknown (None): the fleet options' default count says nothing about a running gateway."""
    urls = [u for u in (args.engine_urls or "").split(",") if u.strip()]
    if urls:
        return len(urls)
    seen = {e for r in results.values() for e in r.engines}
    return len(seen) or None


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--gateway must be an http(s) URL such as http://127.0.0.1:8080, "
                         f"got {redact_url(url)!r}")


def _say(line: str) -> None:
    """A progress line, on stderr (stdout carries the result)."""
    print(line, file=sys.stderr, flush=True)
