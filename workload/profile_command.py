"""`kvgate profile`: a workload's shapes; with --trace, the trace's beside bank-coding's; with
--workload agentic-coding, agentic-coding's beside bank-coding's."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from workload.agentic import AgenticCodingOptions
from workload.bank import BankCodingOptions
from workload.cli import add_workload_arguments, workload_from_args
from workload.profile import WorkloadProfile, markdown_profiles, profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser)
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")


def _profiles(args: argparse.Namespace) -> dict[str, WorkloadProfile]:
    out: dict[str, WorkloadProfile] = {}
    if args.trace is not None:
        out[f"trace {args.trace.name}"] = profile(workload_from_args(args, 0))
    if args.workload == "agentic-coding" and args.trace is None:
        sessions = args.sessions if args.sessions is not None else AgenticCodingOptions().sessions
        agent = argparse.Namespace(**{**vars(args), "sessions": sessions})
        out["agentic-coding"] = profile(workload_from_args(agent, 0))
    if args.sessions is None or args.workload == "agentic-coding":
        args.sessions = BankCodingOptions().sessions
    bank = workload_from_args(argparse.Namespace(**{**vars(args), "trace": None,
                                                    "workload": "bank-coding"}), 0)
    out["bank-coding (these flags)" if args.trace is not None else "bank-coding"] = profile(bank)
    return out


def run(args: argparse.Namespace) -> int:
    try:
        profiles = _profiles(args)
    except ValueError as exc:
        print(f"kvgate profile: {exc}", file=sys.stderr)
        return 2
    print(markdown_profiles(profiles), end="")
    if args.json is not None:
        document = {name: dataclasses.asdict(p) for name, p in profiles.items()}
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(document, indent=2) + "\n")
        except OSError as exc:
            print(f"kvgate profile: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
