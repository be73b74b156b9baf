"""Workload options shared by `kvgate bench` and `kvgate simulate`, and building from them."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from kvgate.runtime.tasks.collector import collector_paused
from workload.agentic import AgenticCodingOptions, agentic_coding
from workload.bank import BankCodingOptions, bank_coding
from workload.model import Workload
from workload.trace import TRACE_BLOCK_TOKENS, mooncake_trace

SESSIONS_PER_ENGINE = 200  # default bank-coding load: see docs/benchmarks.md
AGENT_SESSIONS_PER_ENGINE = 30  # default agentic-coding load: see docs/benchmarks.md
WORKLOADS = ("bank-coding", "agentic-coding")
# agentic-coding takes these from the shared flags; its own have an --agent- prefix.
_SHARED = ("sessions", "seed", "duration_s", "ramp_s", "ramp_start", "decode_s_per_token")
WARMUP_SHARE = 0.1  # default warm-up: the first 10 % of the workload's span

_BANK_HELP = {
    "duration_s": "emulated seconds of traffic",
    "ramp_s": "session starts ramp up to the peak rate over this long",
    "ramp_start": "start rate at t=0 as a fraction of the peak rate",
    "system_tokens": "shared system prompt, tokens",
    "context_median_tokens": "median code context (files) per session, tokens (log-normal)",
    "context_sigma": "log-normal sigma of the code context",
    "context_min_tokens": "smallest code context",
    "context_max_tokens": "largest code context",
    "turns_mean": "mean turns per session (geometric)",
    "turns_max": "most turns in a session",
    "question_median_tokens": "median new question, tokens (log-normal)",
    "question_sigma": "log-normal sigma of questions",
    "answer_median_tokens": "median answer (max_tokens), tokens (log-normal)",
    "answer_sigma": "log-normal sigma of answers",
    "answer_max_tokens": "longest answer",
    "think_median_s": "median think time between an answer and the next question, s",
    "think_sigma": "log-normal sigma of think times",
    "decode_s_per_token": "how fast an answer streams, s/token (for the next turn's nominal "
                          "time and the hour's cut-off; bench and simulate wait for the answer)",
}


_AGENT_HELP = {
    "prefix_tokens": "system prompt + tool schemas every session shares, tokens",
    "task_median_tokens": "median task and first files, tokens (log-normal)",
    "task_sigma": "log-normal sigma of the task",
    "target_min_tokens": "a session's context grows to at least this (log-uniform)",
    "target_max_tokens": "... and at most this",
    "tool_output_median_tokens": "median tool output appended per turn, tokens (log-normal)",
    "tool_output_sigma": "log-normal sigma of tool outputs",
    "tool_output_max_tokens": "largest tool output",
    "answer_median_tokens": "median answer (a tool call), tokens (log-normal)",
    "answer_sigma": "log-normal sigma of answers",
    "answer_max_tokens": "longest answer",
    "tool_median_s": "median tool run time before the next request, s (log-normal)",
    "tool_sigma": "log-normal sigma of tool run times",
    "turns_max": "most requests in a session",
}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload (default: bank-coding)")
    group.add_argument("--workload", choices=WORKLOADS, default="bank-coding",
                       help="the synthetic workload when no --trace is given (%(default)s)")
    group.add_argument("--trace", type=Path, metavar="FILE",
                       help="replay a Mooncake-format trace instead of bank-coding")
    group.add_argument("--trace-limit", type=int, metavar="N", help="only the first N requests")
    group.add_argument("--trace-block-tokens", type=int, metavar="N", default=TRACE_BLOCK_TOKENS,
                       help="tokens per block of the trace's hash_ids (%(default)s, Mooncake's; "
                       "Alibaba's Qwen/Bailian traces use 16)")
    group.add_argument("--sessions", type=int,
                       help=f"bank-coding sessions (default {SESSIONS_PER_ENGINE} per engine)")
    group.add_argument("--seed", type=int, default=0, help="workload seed (%(default)s)")
    group.add_argument("--warmup", type=float, metavar="S",
                       help="emulated seconds at the start excluded from the figures "
                       f"(default {100 * WARMUP_SHARE:.0f}%% of the workload's span)")
    defaults = BankCodingOptions()
    for f in dataclasses.fields(BankCodingOptions):
        if f.name in ("sessions", "seed"):
            continue
        group.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)),
                           default=getattr(defaults, f.name),
                           help=f"bank-coding: {_BANK_HELP[f.name]} (%(default)s)")
    agent = AgenticCodingOptions()
    for f in dataclasses.fields(AgenticCodingOptions):
        if f.name in _SHARED:
            continue
        group.add_argument(f"--agent-{f.name.replace('_', '-')}",
                           type=type(getattr(agent, f.name)), default=getattr(agent, f.name),
                           dest=f"agent_{f.name}",
                           help=f"agentic-coding: {_AGENT_HELP[f.name]} (%(default)s)")


def synthetic(args: argparse.Namespace, engines: int) -> Workload:
    """The synthetic workload ``--workload`` names, from its flags."""
    if getattr(args, "workload", "bank-coding") == "agentic-coding":
        values = {f.name: getattr(args, f.name if f.name in _SHARED else f"agent_{f.name}")
                  for f in dataclasses.fields(AgenticCodingOptions)
                  if f.name not in ("sessions", "seed")}
        sessions = (args.sessions if args.sessions is not None
                    else AGENT_SESSIONS_PER_ENGINE * engines)
        return agentic_coding(AgenticCodingOptions(sessions=sessions, seed=args.seed, **values))
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(BankCodingOptions)
              if f.name not in ("sessions", "seed")}
    sessions = args.sessions if args.sessions is not None else SESSIONS_PER_ENGINE * engines
    return bank_coding(BankCodingOptions(sessions=sessions, seed=args.seed, **values))


def workload_from_args(args: argparse.Namespace, engines: int) -> Workload:
    """The workload the flags describe; ValueError says which flag or trace line is wrong."""
    if args.trace_limit is not None and args.trace_limit < 1:
        raise ValueError("--trace-limit must be >= 1")
    if args.trace_block_tokens < 1:
        raise ValueError("--trace-block-tokens must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    with collector_paused(freeze=True):  # millions of small objects, kept for the whole run
        if args.trace is not None:
            workload = mooncake_trace(args.trace, args.trace_limit, args.trace_block_tokens)
        else:
            workload = synthetic(args, engines)
    span = workload.duration
    workload.warmup_s = args.warmup if args.warmup is not None else WARMUP_SHARE * span
    workload.describe["warmup_s"] = workload.warmup_s
    workload.describe["requests"] = len(workload.requests)
    return workload
