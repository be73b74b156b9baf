"""`agentic-coding`: coding agents in long tool loops over one large shared harness prefix.

Every request starts with the same system prompt and tool schemas (``prefix_tokens``), then the
session's task, then the loop so far: each turn the model answers with a short tool call and the
tool's output (a file read, a grep, a test run) is appended before the next request, so turn t+1's
prompt extends turn t's. A session runs until its context reaches a target drawn between
``target_min_tokens`` and ``target_max_tokens`` (log-uniform), and the next request goes out once
the answer is complete plus the tool's run time (seconds, not minutes). Sessions start open loop
on the same ramp as `bank-coding`.

The shapes and their public sources are in docs/benchmarks.md ("agentic-coding"); none was fitted
to a result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from workload.generate import (
    answer_tokens,
    arrival_problems,
    fresh,
    generated,
    lognormal,
    session_start,
)
from workload.model import Request, Segment, Workload

HARNESS_KEY = 2  # the one system + tool-schema prefix every agent session shares


@dataclass(frozen=True, slots=True)
class AgenticCodingOptions:
    sessions: int = 480  # sessions starting within the run (30 per engine of 16)
    duration_s: float = 3600.0
    ramp_s: float = 900.0
    ramp_start: float = 0.2
    prefix_tokens: int = 15000  # system prompt + tool schemas (10-20k in agent harnesses)
    task_median_tokens: int = 3000  # the task and the first files the agent is shown
    task_sigma: float = 0.6
    target_min_tokens: int = 60000  # a session's context grows to between these (log-uniform)
    target_max_tokens: int = 150000
    tool_output_median_tokens: int = 1200  # appended per turn (log-normal)
    tool_output_sigma: float = 1.0
    tool_output_max_tokens: int = 16000
    answer_median_tokens: int = 150  # a tool call or a short edit (log-normal)
    answer_sigma: float = 0.8
    answer_max_tokens: int = 2048
    tool_median_s: float = 2.0  # the tool's run time before the next request (log-normal)
    tool_sigma: float = 1.0
    turns_max: int = 400
    decode_s_per_token: float = 0.035
    seed: int = 0

    def problems(self) -> list[str]:
        """What is wrong, each with the option's flag name; empty when the options are usable."""
        o = self
        return arrival_problems(
            o,
            (o.prefix_tokens >= 0, "agent-prefix-tokens", ">= 0"),
            (o.task_median_tokens > 0, "agent-task-median-tokens", "> 0"),
            (0 < o.target_min_tokens <= o.target_max_tokens, "agent-target-min-tokens",
             "between 1 and --agent-target-max-tokens"),
            (o.tool_output_median_tokens > 0, "agent-tool-output-median-tokens", "> 0"),
            (o.tool_output_max_tokens >= 1, "agent-tool-output-max-tokens", ">= 1"),
            (o.answer_median_tokens > 0, "agent-answer-median-tokens", "> 0"),
            (o.answer_max_tokens >= 16, "agent-answer-max-tokens", ">= 16"),
            (o.tool_median_s > 0, "agent-tool-median-s", "> 0"),
            (o.turns_max >= 1, "agent-turns-max", ">= 1"),
            (o.decode_s_per_token >= 0, "decode-s-per-token", ">= 0"),
            (min(o.task_sigma, o.tool_output_sigma, o.answer_sigma, o.tool_sigma) >= 0,
             "agent-*-sigma", ">= 0"),
        )


def _session(o: AgenticCodingOptions, index: int) -> list[Request]:
    rng, t = session_start("agentic-coding", o, index)
    session = f"agent-{o.seed}-{index:07d}"
    target = math.exp(rng.uniform(math.log(o.target_min_tokens), math.log(o.target_max_tokens)))
    task = round(lognormal(rng, o.task_median_tokens, o.task_sigma, 200, 20000))
    chain: list[Segment] = [Segment(HARNESS_KEY, o.prefix_tokens), fresh(rng, task)]
    size = o.prefix_tokens + task
    requests: list[Request] = []
    tool_s: float | None = None  # the first request comes at the session's start
    for _ in range(o.turns_max):
        if t >= o.duration_s or size >= target:
            break
        answer = answer_tokens(rng, o)
        requests.append(Request(t, session, chain, len(chain), answer, tool_s))
        output = round(lognormal(rng, o.tool_output_median_tokens, o.tool_output_sigma, 16,
                                  o.tool_output_max_tokens))
        chain.append(fresh(rng, answer))  # the tool call, resent
        chain.append(fresh(rng, output))  # what the tool printed
        size += answer + output
        tool_s = lognormal(rng, o.tool_median_s, o.tool_sigma, 0.2, 300.0)
        t += answer * o.decode_s_per_token + tool_s
    return requests


def agentic_coding(options: AgenticCodingOptions) -> Workload:
    """The workload, sorted by arrival (ties by session)."""
    return generated("agentic-coding", options.problems(), options.sessions,
                     lambda i: _session(options, i), asdict(options))
