"""`kvgate check-config FILE`: prints OK or every problem, exits non-zero on any; warnings
(allowed, probably unwise) are printed either way."""

from __future__ import annotations

import argparse
import sys

from kvgate.config import ConfigError
from kvgate.config.load import check_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="path to a kvgate YAML file")


def run(args: argparse.Namespace) -> int:
    try:
        checked = check_file(args.file)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print(f"{len(exc.problems)} problem(s); nothing applied", file=sys.stderr)
        return 1
    for warning in checked.warnings:
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    config = checked.config
    endpoints = sum(len(p.endpoints) for p in config.pools)
    warned = f", {len(checked.warnings)} warning(s)" if checked.warnings else ""
    print(f"OK: {args.file}: {len(config.pools)} pool(s), {endpoints} endpoint(s), "
          f"{len(config.routes)} route(s){warned}")
    return 0
