"""Engine-fleet options shared by `kvgate simulate` and `kvgate bench --compare`, so both
model the same engines (the emulator's own options and defaults)."""

from __future__ import annotations

import argparse

from emulator.options import EmulatorOptions

DEFAULT_BLOCK_SIZE = 128  # vLLM-Ascend's block, as on the bank's fleet

_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("hbm_tokens", int, "HBM KV capacity per engine, tokens"),
    ("ddr_tokens", int, "DDR pool capacity, tokens (default 8 x the fleet's HBM)"),
    ("prefill_tokens_per_s", float, "prefill rate per engine"),
    ("decode_ms_per_token", float, "decode time per output token"),
    ("prefill_overhead_ms", float, "fixed TTFT overhead"),
    ("ddr_gbps", float, "DDR->HBM bandwidth per engine, GB/s"),
    ("max_num_seqs", int, "concurrent requests per engine"),
)


def int_list(text: str) -> list[int]:
    """``8,12,16`` -> ``[8, 12, 16]`` (an argparse type)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
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
        several = lists and name == "ddr_tokens"
        group.add_argument(f"--{name.replace('_', '-')}", type=int_list if several else kind,
                           default=getattr(defaults, name),
                           help=f"{text}{', comma-separated to try several' if several else ''}"
                                f" (%(default)s)")


def emulator_options(args: argparse.Namespace, time_scale: float = 1.0) -> EmulatorOptions:
    options = EmulatorOptions(instances=args.engines, block_size=args.block_size,
                              time_scale=time_scale,
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
    flags: list[str] = ["--block-size", str(options.block_size)]
    for name, _, _ in _FIELDS:
        value = getattr(options, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return tuple(flags)
