"""``kvgate emulate`` / ``python -m emulator``: run an emulated fleet until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from emulator.fleet import Fleet
from emulator.options import ROLES, EmulatorOptions
from emulator.pool_faults import pool_window
from emulator.pool_profiles import PROFILES
from emulator.processes import Workers, share_options, shares
from emulator.timing import SCHEDULERS
from kvgate.runtime.children.child import ChildFailed
from kvgate.runtime.tasks.loop import run as run_loop

log = structlog.get_logger("emulator.command")


def time_scale(text: str) -> float:
    """A non-negative number or a fraction like ``1/60``."""
    try:
        num, _, den = text.partition("/")
        value = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError) as exc:
        raise argparse.ArgumentTypeError(f"not a number or fraction: {text!r}") from exc
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def port_list(text: str) -> tuple[int, ...]:
    """``8101,8105,8109`` -> ``(8101, 8105, 8109)`` (an argparse type)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated port numbers, got {text!r}") from None


def role_list(text: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in text.split(","))
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated roles ({', '.join(ROLES)}), got {', '.join(bad)}")
    return roles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's options (defaults: DESIGN.md's published figures)."""
    d = EmulatorOptions()
    _add_table(parser, FLEET_FLAGS, d)
    a = parser.add_argument
    a("--ports", type=port_list, default=(), metavar="P1,P2,...",
      help="one port per instance, in order (instead of --port)")
    roles = parser.add_mutually_exclusive_group()
    roles.add_argument("--roles", type=role_list, default=(), metavar="R1,R2,...",
                       help="one role per instance (both, prefill, decode): a prefill engine "
                       "answers vLLM's two-stage kv_transfer_params and holds its blocks for "
                       "a decode engine's pull; a decode engine pulls what it lacks and "
                       "neither reads nor writes the DDR pool (default: all both)")
    roles.add_argument("--role", choices=ROLES, default=None,
                       help="the same role for every instance")
    engine = parser.add_argument_group("the engines' model")
    _add_table(engine, ENGINE_FLAGS, d)
    engine.add_argument(
        "--scheduler", choices=list(SCHEDULERS), default=d.scheduler,
        help="timing model: fcfs, a serial prefill queue (%(default)s); vllm-steps, vLLM's "
             "step loop with chunked prefill under --max-num-batched-tokens (emulator.steps)")
    pool = parser.add_argument_group("the DDR pool")
    pool.add_argument(
        "--pool-connector", choices=list(PROFILES), default=d.pool_connector,
        help="whose rules fill and evict the hosted DDR pool: what a lookup refreshes, what a "
             "request writes, how the pool evicts (%(default)s, the bank's stack)")
    _add_table(pool, POOL_FLAGS, d)
    pool.add_argument(
        "--pool-fail", type=pool_window(False), action="append", default=[],
        metavar="T@DURATION", help="the hosted pool is down from emulated second T (since "
        "start) for DURATION seconds; repeatable")
    pool.add_argument(
        "--pool-slow", type=pool_window(True), action="append", default=[],
        metavar="T@DURATION:FACTOR",
        help="the hosted pool's links keep FACTOR of their bandwidth in that window; repeatable")
    pool.add_argument("--no-ddr-pool", action="store_true", help="run without a DDR pool")
    a("--ready-file", type=Path, default=None,
      help="write {engines, pool_url, pid} as JSON here once everything listens")
    a("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_table(parser.add_argument_group("KV cache events (vLLM's --kv-events-config, ZMQ)"),
               KV_EVENT_FLAGS, d)


# (flag, type, help) of the options declared as tables; each default is EmulatorOptions' field
# of the same name, appended to the help unless the help says it.
FlagRow = tuple[str, Callable[[str], Any], str]
FLEET_FLAGS: tuple[FlagRow, ...] = (
    ("--instances", int, "number of engine instances"),
    ("--processes", int, "processes serving the instances, so the emulator's own CPU spreads "
     "over cores; the first also hosts the DDR pool"),
    ("--host", str, "address to listen on"),
    ("--port", int, "first instance's port; the others use the next ones; 0 = free ports"),
    ("--model", str, "served model name"),
    ("--seed", int, "seed for generated text"),
    ("--engine-id", str, "x-engine-id template with {host}, {port}, {index}"),
)
ENGINE_FLAGS: tuple[FlagRow, ...] = (
    ("--block-size", int, "KV block size in tokens; 128 mirrors vLLM-Ascend"),
    ("--hbm-tokens", int, "HBM KV capacity per instance, tokens"),
    ("--prefill-tokens-per-s", float, "prefill rate"),
    ("--decode-ms-per-token", float, "decode time per output token"),
    ("--prefill-overhead-ms", float, "fixed TTFT overhead c0"),
    ("--prompt-us-per-token", float, "TTFT per prompt token, cached or not (tokenizing, "
                                     "hashing and looking up its blocks)"),
    ("--kv-bytes-per-token", int, "KV bytes per token, for DDR transfer time"),
    ("--max-num-seqs", int, "concurrent requests per instance"),
    ("--max-num-batched-tokens", int, "token budget of one engine step, vllm-steps only "
     "(vLLM-CPU's for its OpenAI server)"),
    ("--time-scale", time_scale, "wall seconds per emulated second; 1/60 runs an hour in a "
     "minute; 0 = never wait"),
    ("--max-model-len", int, "vLLM's max_model_len: a longer prompt (less max_tokens) gets "
     "vLLM's 400; /tokenize reports it"),
)
POOL_FLAGS: tuple[FlagRow, ...] = (
    ("--ddr-tokens", int, "DDR pool capacity, tokens (default --pool-hbm-multiple x the "
     "fleet's HBM)"),
    ("--pool-hbm-multiple", float, "DDR pool capacity as a multiple of the fleet's HBM"),
    ("--pool-high-watermark", float, "the pool evicts once it holds this share of its "
     "capacity (default: the connector's)"),
    ("--pool-low-watermark", float, "... down to this share (default: the connector's)"),
    ("--ddr-gbps", float, "DDR pool->HBM link per instance (device), GB/s"),
    ("--node-gbps", float, "DDR pool->HBM aggregate per node, GB/s; 0 = its devices' links"),
    ("--pool-gbps", float, "DDR pool->HBM aggregate of the whole pool, GB/s; 0 = no limit"),
    ("--devices-per-node", int, "instances per node, in order"),
    ("--transfer-fixed-ms", float, "fixed cost of every DDR transfer, ms"),
    ("--pool-url", str, "join an existing DDR pool service instead of hosting one (default: "
     "host one)"),
    ("--pool-port", int, "DDR pool port; 0 = free port"),
)
KV_EVENT_FLAGS: tuple[FlagRow, ...] = (
    ("--kv-events-port", int, "publish each instance's KV cache events as vLLM does (ZMQ PUB on "
     "tcp://HOST:PORT): the first instance's port, the others use the next ones; 0 = off"),
    ("--kv-events-replay-port", int, "vLLM's replay socket (ROUTER): the first instance's "
     "port, the others use the next ones; 0 = none"),
    ("--kv-events-topic", str, "topic of every KV event message"),
)


def _add_table(group: argparse.ArgumentParser | argparse._ArgumentGroup,
               rows: tuple[FlagRow, ...], defaults: EmulatorOptions) -> None:
    for flag, kind, text in rows:
        shown = "" if "default" in text else " (%(default)s)"
        group.add_argument(flag, type=kind, default=getattr(defaults, _dest(flag)),
                           help=f"{text}{shown}")


def _dest(flag: str) -> str:
    """``--kv-events-port`` -> ``kv_events_port`` (argparse's and EmulatorOptions' name)."""
    return flag.removeprefix("--").replace("-", "_")


def options_from_args(args: argparse.Namespace) -> EmulatorOptions:
    """Map parsed arguments to :class:`EmulatorOptions`."""
    return EmulatorOptions(
        instances=args.instances,
        host=args.host,
        port=args.port,
        ports=args.ports,
        model=args.model,
        block_size=args.block_size,
        hbm_tokens=args.hbm_tokens,
        ddr_tokens=args.ddr_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_ms_per_token=args.decode_ms_per_token,
        prefill_overhead_ms=args.prefill_overhead_ms,
        prompt_us_per_token=args.prompt_us_per_token,
        kv_bytes_per_token=args.kv_bytes_per_token,
        ddr_gbps=args.ddr_gbps,
        node_gbps=args.node_gbps,
        pool_gbps=args.pool_gbps,
        devices_per_node=args.devices_per_node,
        transfer_fixed_ms=args.transfer_fixed_ms,
        pool_hbm_multiple=args.pool_hbm_multiple,
        pool_connector=args.pool_connector,
        pool_high_watermark=args.pool_high_watermark,
        pool_low_watermark=args.pool_low_watermark,
        pool_fail=tuple(args.pool_fail),
        pool_slow=tuple(args.pool_slow),
        max_num_seqs=args.max_num_seqs,
        scheduler=args.scheduler,
        max_num_batched_tokens=args.max_num_batched_tokens,
        time_scale=args.time_scale,
        seed=args.seed,
        pool_url=args.pool_url,
        no_ddr_pool=args.no_ddr_pool,
        pool_port=args.pool_port,
        engine_id=args.engine_id,
        max_model_len=args.max_model_len,
        processes=args.processes,
        roles=args.roles or ((args.role,) * args.instances if args.role else ()),
        **{_dest(flag): getattr(args, _dest(flag)) for flag, _, _ in KV_EVENT_FLAGS},
    )


def configure_logging(level: str) -> None:
    """Structured JSON logs on stderr."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def write_ready_file(path: Path, engines: list[str], pool_url: str | None,
                     roles: tuple[str, ...] = ()) -> None:
    """Atomically write the ready file (temp file + rename, so readers never see half of it).
    `roles`: one per engine when not all `both`."""
    payload = {"engines": engines, "pool_url": pool_url, "pid": os.getpid(),
               **({"roles": list(roles)} if roles else {})}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload) + "\n")
    os.replace(tmp, path)


async def serve(options: EmulatorOptions, ready_file: Path | None,
                log_level: str = "info") -> int:
    """Run the fleet until SIGINT/SIGTERM (or, with several processes, until a worker dies:
    exit code 1)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    first = options
    if options.processes > 1:
        first = share_options(options, shares(options.instances, options.processes)[0], None)
    fleet = Fleet(first, fleet_ports=options.instance_ports())
    workers = Workers(options, log_level)
    code = 0
    try:
        await fleet.start()
        engines = fleet.engines
        if options.processes > 1:
            engines = engines + await workers.start(fleet.pool_url)
        if fleet.pool_url:
            print(f"ddr pool   {fleet.pool_url}", flush=True)
        for i, engine in enumerate(engines):
            print(f"engine {options.first_index + i:<3} http://{engine}", flush=True)
        if ready_file is not None:
            write_ready_file(ready_file, engines, fleet.pool_url, options.roles)
        log.info("fleet_ready", engines=engines, pool_url=fleet.pool_url,
                 processes=options.processes)
        stopped = asyncio.ensure_future(stop.wait())
        died = asyncio.ensure_future(workers.exited())
        await asyncio.wait({stopped, died}, return_when=asyncio.FIRST_COMPLETED)
        for future in (stopped, died):
            future.cancel()
        if died.done() and not died.cancelled():
            log.error("worker_exited", reason=died.result())
            code = 1
        log.info("fleet_stopping")
    finally:
        await workers.stop()
        await fleet.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return code


def run(args: argparse.Namespace) -> int:
    """Entry point used by ``kvgate emulate`` and ``python -m emulator``."""
    configure_logging(args.log_level)
    try:
        options = options_from_args(args)
        options.validate()
    except ValueError as exc:
        print(f"kvgate emulate: {exc}", file=sys.stderr)
        return 2
    try:
        return run_loop(serve(options, args.ready_file, args.log_level))
    except (OSError, ChildFailed) as exc:
        log.error("startup_failed", error=str(exc))
        return 1
