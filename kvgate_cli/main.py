"""The `kvgate` command: one subcommand per module, imported only when chosen."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata

from kvgate.extras import MissingExtra, extra_providing, require

# subcommand → (module, help). Each module offers add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("kvgate_cli.up.command", "run the whole stack on this machine"),
    "check-config": ("kvgate.config.command", "validate a kvgate YAML file"),
    "envoy-config": ("control_plane.resources.command", "render a static Envoy bootstrap"),
    "ext-proc": ("ext_proc.command", "run the ext_proc routing service"),
    "control-plane": ("control_plane.command", "run the control plane (health, endpoint states)"),
    "emulate": ("emulator.command", "run an emulated vLLM fleet with a shared DDR KV pool"),
    "endpoints": ("kvgate_cli.admin.endpoints", "list, drain, undrain or fail endpoints"),
    "sessions": ("kvgate_cli.admin.sessions", "list, show or move session bindings"),
    "status": ("kvgate_cli.admin.status", "control plane, Envoy nodes and endpoints at a glance"),
    "register": ("kvgate_cli.register", "keep an engine registered in etcd while it runs "
                 "(pools[].discover.etcd)"),
    "bench": ("bench.command", "benchmark a gateway, or compare routing modes"),
    "simulate": ("simulator.command", "simulate a fleet behind each routing mode"),
    "plan": ("simulator.plan_command", "the smallest fleet (or P/D split) meeting a TTFT goal"),
    "profile": ("workload.profile_command",
                "measure a workload's shapes (a trace beside bank-coding)"),
}

# subcommand → the pip extra it needs (charts, progress bars), checked before it starts
NEEDS_EXTRA: dict[str, str] = {"bench": "bench", "simulate": "bench"}


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvgate {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(command_parser)
    return parser


def version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""
    try:
        return metadata.version("kvgate")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(chosen if chosen in COMMANDS else None)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command in NEEDS_EXTRA:
            require(args.command, NEEDS_EXTRA[args.command])
        module = importlib.import_module(COMMANDS[args.command][0])
        return int(module.run(args) or 0)
    except MissingExtra as exc:
        print(exc, file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # an extra's module imported where none was declared
        extra = extra_providing(exc.name)
        if extra is None or chosen is None:
            raise
        print(MissingExtra(chosen, extra, exc.name or extra), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
