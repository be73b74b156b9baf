"""What `kvgate bench` and `kvgate simulate` read from their shared flags, checked before anything
runs: the engines, the workload and a writable output folder."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from benchkit.fleet_options import emulator_options
from benchkit.report import check_out_dir
from emulator.options import EmulatorOptions
from workload.cli import workload_from_args
from workload.model import Workload


class InputError(Exception):
    """A flag, trace file or output folder that cannot be used; the message names it."""


def engines_and_workload(
    args: argparse.Namespace,
    time_scale: float = 1.0,
    check: Callable[[EmulatorOptions], None] = lambda engines: None,
) -> tuple[EmulatorOptions, Workload]:
    """``check`` sees the engine options first, for the flags only one command has."""
    try:
        engines = emulator_options(args, time_scale)
        check(engines)
        if args.out is not None:
            check_out_dir(args.out)
        workload = workload_from_args(args, engines.instances)
        # The emulated engines refuse a prompt past their context as vLLM does; the bench
        # models a fleet serving its whole workload, so their context covers its longest
        # request, twice over (a resent answer, as long as the engine made it, stands in for a
        # segment of the workload's own length: workload.text.TextMaker.prompt).
        longest = max((r.prompt_tokens + r.max_tokens for r in workload.requests), default=0)
        engines.max_model_len = max(engines.max_model_len, 2 * longest)
        return engines, workload
    except ValueError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"--out {args.out}: {exc.strerror or exc}") from None
