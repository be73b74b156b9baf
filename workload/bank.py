"""`bank-coding`: developers in multi-turn sessions with a code assistant, ramping to a peak.

Each turn's prompt = shared system prompt + the session's code files + the conversation so far
(earlier questions and answers) + a new question; turn t+1's prompt therefore extends turn t's.
Sessions start open loop, on a ramp to a peak that then holds; within a session, a developer asks
again once the previous answer is complete, plus a think time (closed loop: the next prompt
contains that answer). ``Request.arrival`` of a later turn is its time if every answer came at
once (answer tokens x the decode rate); the bench and the simulator send it after the real answer.

Defaults are assumptions drawn from published shapes of coding-assistant use, not fitted to any
result; docs/benchmarks.md gives the reasoning for each.
"""

from __future__ import annotations

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

SYSTEM_KEY = 1  # the one system prompt every session shares


@dataclass(frozen=True, slots=True)
class BankCodingOptions:
    sessions: int = 3200  # developer sessions starting within the run (200 per engine of 16)
    duration_s: float = 3600.0  # one hour of peak (emulated seconds)
    ramp_s: float = 900.0  # session starts ramp linearly up to the peak rate over this long
    ramp_start: float = 0.2  # start rate at t=0 as a fraction of the peak rate
    # Shared system prompt: the Mooncake production trace shares one 512-token block across
    # every request (512..1023 tokens); the top of that range (see docs/benchmarks.md).
    system_tokens: int = 1000
    context_median_tokens: int = 12000  # the session's open code files (log-normal)
    context_sigma: float = 0.6
    context_min_tokens: int = 2000
    context_max_tokens: int = 48000
    turns_mean: float = 6.0  # turns per session (geometric)
    turns_max: int = 40
    question_median_tokens: int = 150  # new question, incl. a pasted snippet (log-normal)
    question_sigma: float = 0.8
    answer_median_tokens: int = 400  # answer length = max_tokens (log-normal)
    answer_sigma: float = 0.6
    answer_max_tokens: int = 2048
    think_median_s: float = 60.0  # reading the answer, editing, asking again (log-normal)
    think_sigma: float = 0.8
    decode_s_per_token: float = 0.035  # how fast an answer streams (the engines' decode rate)
    seed: int = 0

    def problems(self) -> list[str]:
        """What is wrong, each with the option's flag name; empty when the options are usable."""
        o = self
        return arrival_problems(
            o,
            (o.system_tokens >= 0, "system-tokens", ">= 0"),
            (o.context_median_tokens > 0, "context-median-tokens", "> 0"),
            (0 <= o.context_min_tokens <= o.context_max_tokens, "context-min-tokens",
             "between 0 and --context-max-tokens"),
            (o.turns_mean >= 1, "turns-mean", ">= 1"),
            (o.turns_max >= 1, "turns-max", ">= 1"),
            (o.question_median_tokens > 0, "question-median-tokens", "> 0"),
            (o.answer_median_tokens > 0, "answer-median-tokens", "> 0"),
            (o.answer_max_tokens >= 16, "answer-max-tokens", ">= 16"),
            (o.think_median_s > 0, "think-median-s", "> 0"),
            (o.decode_s_per_token >= 0, "decode-s-per-token", ">= 0"),
            (min(o.context_sigma, o.question_sigma, o.answer_sigma, o.think_sigma) >= 0,
             "*-sigma", ">= 0"),
        )


def _session(o: BankCodingOptions, index: int) -> list[Request]:
    rng, start = session_start("bank-coding", o, index)
    session = f"bank-{o.seed}-{index:07d}"
    context = round(lognormal(rng, o.context_median_tokens, o.context_sigma,
                               o.context_min_tokens, o.context_max_tokens))
    turns = 1
    p_stop = 1.0 / max(1.0, o.turns_mean)
    while turns < o.turns_max and rng.random() > p_stop:
        turns += 1
    chain: list[Segment] = [Segment(SYSTEM_KEY, o.system_tokens), fresh(rng, context)]
    requests: list[Request] = []
    t = start
    think: float | None = None  # the first turn comes at the session's start
    for _ in range(turns):
        if t >= o.duration_s:
            break
        question = round(lognormal(rng, o.question_median_tokens, o.question_sigma, 8, 8000))
        answer = answer_tokens(rng, o)
        chain.append(fresh(rng, question))
        requests.append(Request(t, session, chain, len(chain), answer, think))
        chain.append(fresh(rng, answer))  # the reply, resent later
        think = lognormal(rng, o.think_median_s, o.think_sigma, 5.0, 1800.0)
        t += answer * o.decode_s_per_token + think
    return requests


def bank_coding(options: BankCodingOptions) -> Workload:
    """The workload, sorted by arrival (ties by session)."""
    return generated("bank-coding", options.problems(), options.sessions,
                     lambda i: _session(options, i), asdict(options))
