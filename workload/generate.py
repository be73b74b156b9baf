"""What the generated workloads (`bank-coding`, `agentic-coding`) share: sessions that start open
loop on a ramp to a peak rate, each drawn from its own seeded random stream; log-normal draws;
segments no other request shares; the checks of the options every generator has; and the
workload assembled from its sessions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, Protocol

from workload.model import Request, Segment, Workload


class Arrivals(Protocol):
    """The session-arrival options every generated workload has."""

    @property
    def sessions(self) -> int: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def ramp_s(self) -> float: ...
    @property
    def ramp_start(self) -> float: ...
    @property
    def seed(self) -> int: ...


class Answers(Protocol):
    """The answer-length options every generated workload has."""

    @property
    def answer_median_tokens(self) -> int: ...
    @property
    def answer_sigma(self) -> float: ...
    @property
    def answer_max_tokens(self) -> int: ...


def arrival_problems(o: Arrivals, *checks: tuple[bool, str, str]) -> list[str]:
    """The arrival checks every workload shares, then ``checks`` (ok, flag, rule): each one
    failed as a message naming its flag; empty when the options are usable."""
    every = (
        (o.sessions >= 0, "sessions", ">= 0"),
        (o.duration_s > 0, "duration-s", "> 0"),
        (o.ramp_s >= 0, "ramp-s", ">= 0"),
        (0 < o.ramp_start <= 1, "ramp-start", "in (0, 1]"),
        *checks,
    )
    return [f"--{flag} must be {rule}" for ok, flag, rule in every if not ok]


def lognormal(rng: random.Random, median: float, sigma: float, low: float, high: float) -> float:
    return min(high, max(low, rng.lognormvariate(math.log(median), sigma)))


def start_time(u: float, duration_s: float, ramp_s: float, ramp_start: float) -> float:
    """Inverse CDF of the session-start rate: linear ramp from ramp_start to 1, then flat."""
    ramp = min(ramp_s, duration_s)
    r0 = ramp_start
    ramp_mass = r0 * ramp + (1 - r0) * ramp / 2
    total = ramp_mass + (duration_s - ramp)
    target = u * total
    if target >= ramp_mass or ramp <= 0:
        return ramp + (target - ramp_mass)
    a = (1 - r0) / (2 * ramp)  # a t^2 + r0 t = target
    if a == 0:
        return target / r0
    return (-r0 + math.sqrt(r0 * r0 + 4 * a * target)) / (2 * a)


def session_start(name: str, o: Arrivals, index: int) -> tuple[random.Random, float]:
    """Session `index`'s own random stream (the same for the same seed, whatever the other
    sessions draw) and its start time, the stream's first draw."""
    rng = random.Random(f"{name}:{o.seed}:{index}")
    return rng, start_time(rng.random(), o.duration_s, o.ramp_s, o.ramp_start)


def answer_tokens(rng: random.Random, o: Answers) -> int:
    """An answer's length (max_tokens): log-normal, at least 16 tokens."""
    return round(lognormal(rng, o.answer_median_tokens, o.answer_sigma, 16, o.answer_max_tokens))


def fresh(rng: random.Random, tokens: int) -> Segment:
    """A segment of text no other request has: a random key with its top bit set, clear of the
    small keys of the prefixes sessions share."""
    return Segment(rng.getrandbits(62) | 1 << 62, tokens)


def generated(name: str, problems: list[str], sessions: int,
              session: Callable[[int], list[Request]], describe: dict[str, Any]) -> Workload:
    """A generator's workload: each session's requests, sorted by arrival (ties by session);
    ValueError naming every problem of the options first."""
    if problems:
        raise ValueError("; ".join(problems))
    requests = [r for i in range(sessions) for r in session(i)]
    requests.sort(key=lambda r: (r.arrival, r.session))
    return Workload(name, requests, {"name": name, **describe})
