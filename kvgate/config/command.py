"""`kvgate check-config FILE`: prints OK or every problem, exits non-zero on any."""

from __future__ import annotations

import argparse
import sys

from kvgate.config import ConfigError, load_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="path to a kvgate YAML file")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_file(args.file)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print(f"{len(exc.problems)} problem(s); nothing applied", file=sys.stderr)
        return 1
    endpoints = sum(len(p.endpoints) for p in config.pools)
    print(f"OK: {args.file}: {len(config.pools)} pool(s), {endpoints} endpoint(s), "
          f"{len(config.routes)} route(s)")
    return 0
