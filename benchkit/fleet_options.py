"""Engine-fleet options shared by `kvgate simulate` and `kvgate bench --compare`, so both
model the same engines (the emulator's own options and defaults)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from emulator.options import DEFAULT_MAX_MODEL_LEN, EmulatorOptions
from emulator.pool_faults import pool_window
from emulator.pool_profiles import DEFAULT_PROFILE, PROFILES
from emulator.timing import FCFS

DEFAULT_BLOCK_SIZE = 128  # vLLM-Ascend's block, as on the bank's fleet

_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("hbm_tokens", int, "HBM KV capacity per engine, tokens"),
    ("ddr_tokens", int, "DDR pool capacity, tokens (default --pool-hbm-multiple x the fleet's "
                        "HBM)"),
    ("pool_hbm_multiple", float, "DDR pool capacity as a multiple of the fleet's HBM, when "
                                 "--ddr-tokens is not given"),
    ("prefill_tokens_per_s", float, "prefill rate per engine"),
    ("decode_ms_per_token", float, "decode time per output token"),
    ("prefill_overhead_ms", float, "fixed TTFT overhead"),
    ("ddr_gbps", float, "DDR pool->HBM link per engine (device), GB/s"),
    ("node_gbps", float, "DDR pool->HBM aggregate per node, GB/s; 0 = its devices' links"),
    ("pool_gbps", float, "DDR pool->HBM aggregate of the whole pool, GB/s; 0 = no limit"),
    ("devices_per_node", int, "engines per node (they share the node's link)"),
    ("transfer_fixed_ms", float, "fixed cost of every DDR transfer, ms"),
    ("pool_high_watermark", float, "the pool evicts once it holds this share of its capacity "
                                   "(default: the connector's)"),
    ("pool_low_watermark", float, "... down to this share (default: the connector's)"),
    ("max_num_seqs", int, "concurrent requests per engine"),
)
N = TypeVar("N", int, float)
LIST_FIELDS = ("ddr_tokens", "node_gbps")  # `kvgate plan` tries several of each


def float_list(text: str) -> list[float]:
    """``40,80,144`` -> ``[40.0, 80.0, 144.0]`` (an argparse type)."""
    return _number_list(text, float, "numbers", "number")


def int_list(text: str) -> list[int]:
    """``8,12,16`` -> ``[8, 12, 16]`` (an argparse type)."""
    return _number_list(text, int, "integers", "integer")


def _number_list(text: str, kind: Callable[[str], N], plural: str, singular: str) -> list[N]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated {plural}, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one {singular}")
    return values


def add_fleet_arguments(parser: argparse.ArgumentParser, engines: int,
                        lists: bool = False) -> None:
    """``lists``: ``--engines`` and ``--ddr-tokens`` take comma-separated values (plans)."""
    group = parser.add_argument_group("engines (the emulator's model and defaults)")
    if lists:
        group.add_argument("--engines", type=int_list, required=True,
                           help="fleet sizes to try, comma-separated (e.g. 8,12,16,24)")
    else:
        group.add_argument("--engines", type=int, default=engines, help="engines (%(default)s)")
    group.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                       help="KV block, tokens (%(default)s)")
    defaults = EmulatorOptions()
    for name, kind, text in _FIELDS:
        several = lists and name in LIST_FIELDS
        listed = int_list if kind is int else float_list
        default = getattr(defaults, name)
        group.add_argument(f"--{name.replace('_', '-')}", type=listed if several else kind,
                           default=[default] if several and default is not None else default,
                           help=f"{text}{', comma-separated to try several' if several else ''}"
                                f" (%(default)s)")
    group.add_argument("--pool-connector", choices=list(PROFILES), default=DEFAULT_PROFILE,
                       help="whose rules fill and evict the DDR pool: what a lookup refreshes, "
                            "what a request writes, how the pool evicts (%(default)s, the "
                            "bank's stack; docs/benchmarks.md cites each rule's source)")
    group.add_argument("--pool-fail", type=pool_window(False), action="append", default=[],
                       metavar="T@DURATION",
                       help="the DDR pool is down from emulated second T for DURATION seconds "
                            "(lookups miss, nothing is stored; it comes back empty); repeatable")
    group.add_argument("--pool-slow", type=pool_window(True), action="append", default=[],
                       metavar="T@DURATION:FACTOR",
                       help="the DDR pool's links keep FACTOR of their bandwidth from T for "
                            "DURATION seconds; repeatable")


def emulator_options(args: argparse.Namespace, time_scale: float = 1.0) -> EmulatorOptions:
    options = EmulatorOptions(instances=args.engines, block_size=args.block_size,
                              time_scale=time_scale, pool_fail=tuple(args.pool_fail),
                              pool_connector=args.pool_connector,
                              pool_slow=tuple(args.pool_slow),
                              **{name: getattr(args, name) for name, _, _ in _FIELDS})
    try:
        options.validate()
    except ValueError as exc:  # the emulator names its fields; say the flag given here
        name, _, rest = str(exc).partition(" ")
        flag = "engines" if name == "instances" else name.replace("_", "-")
        raise ValueError(f"--{flag} {rest}") from None
    return options


def emulator_flags(options: EmulatorOptions) -> tuple[str, ...]:
    """The same options as `python -m emulator` flags (instances and time scale excluded)."""
    flags: list[str] = ["--block-size", str(options.block_size),
                        "--pool-connector", options.pool_connector]
    for name, _, _ in _FIELDS:
        value = getattr(options, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    if options.max_model_len != DEFAULT_MAX_MODEL_LEN:  # sized to a workload (benchkit.inputs)
        flags += ["--max-model-len", str(options.max_model_len)]
    if options.scheduler != FCFS:  # runs of the default model keep their command lines
        flags += ["--scheduler", options.scheduler,
                  "--max-num-batched-tokens", str(options.max_num_batched_tokens)]
    for window in options.pool_fail:
        flags += ["--pool-fail", f"{window.start:g}@{window.duration:g}"]
    for window in options.pool_slow:
        flags += ["--pool-slow", f"{window.start:g}@{window.duration:g}:{window.factor:g}"]
    return tuple(flags)
