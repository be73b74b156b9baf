"""A component's own entry point (`python -m ext_proc`, `control_plane`, `emulator`): its flags
and its run, as `kvgate SUBCOMMAND` has them, without the application layer's command table."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def run_alone(
    prog: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
) -> int:
    """Parses ``argv`` (default: the command line) with the command's flags and runs it; the exit
    status, 130 after Ctrl-C as with `kvgate`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    try:
        return int(run(parser.parse_args(argv)) or 0)
    except KeyboardInterrupt:
        return 130
