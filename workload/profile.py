"""A workload's shapes, measured the same way for a trace and for `bank-coding` (pure).

What decides prefix-cache hits and load: how much every request shares (the system prompt), how
large first prompts are, how many turns a session has and how far apart, how much each turn adds,
and how long answers are. Measuring a real trace and the synthetic workload with one function is
how `bank-coding`'s defaults are checked against production data (`kvgate profile`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from workload.model import Request, Workload


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and deciles of a sample (all 0 for an empty one)."""

    mean: float = 0.0
    p10: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    largest: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls()
        if len(values) == 1:
            v = float(values[0])
            return cls(v, v, v, v, v)
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        return cls(statistics.fmean(values), deciles[0], deciles[4], deciles[8],
                   float(max(values)))


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    requests: int
    span_s: float
    sessions: int
    # How the sessions were known: "workload" (it says), "inferred" (a trace's blocks, see
    # workload.conversations), "record ids", or "record ids + inferred".
    sessions_from: str
    # Leading tokens every request has in common. A trace only says which blocks are equal
    # (512 tokens, or --trace-block-tokens), so there the true shared prefix lies in
    # [shared_prefix_tokens, + resolution).
    shared_prefix_tokens: int
    shared_prefix_resolution: int
    prompt_tokens: Spread
    first_prompt_tokens: Spread  # a session's first request
    turns: Spread  # requests per session
    growth_tokens: Spread  # a turn's prompt minus the previous turn's
    gap_s: Spread  # arrival to arrival between consecutive turns of a session
    answer_tokens: Spread  # max_tokens (trace: output_length)
    extends_previous: float  # share of later turns whose prompt starts with the previous one's
    # Most prompt tokens live at once: every session in progress (from its first to its last
    # request) at its largest prompt, the shared prefix once. What a pool must hold to keep all.
    peak_working_set_tokens: int = 0


def _shared_prefix(requests: Sequence[Request]) -> int:
    """Tokens of the leading segments that are the same in every request."""
    first = requests[0].segments
    depth = len(first)
    for request in requests:
        segments = request.segments
        depth = min(depth, len(segments))
        i = 0
        while i < depth and segments[i].key == first[i].key:
            i += 1
        depth = i
        if depth == 0:
            return 0
    # Equal keys are equal text; a shorter segment is a prefix of a longer one.
    return sum(min(r.segments[i].tokens for r in requests) for i in range(depth))


def _extends(previous: Request, later: Request) -> bool:
    """Whether ``later``'s prompt starts with all of ``previous``'s but its last segment, which a
    trace may cut short."""
    before, after = previous.segments, later.segments
    whole = len(before) - 1
    return len(after) >= whole and all(
        a.key == b.key for a, b in zip(before[:whole], after, strict=False))


def peak_working_set(requests: Sequence[Request], shared: int = 0) -> int:
    """Most tokens held at once by sessions in progress (nominal arrivals), each at its largest
    prompt, with ``shared`` leading tokens counted once."""
    spans: dict[str, list[float]] = {}
    for r in requests:
        span = spans.setdefault(r.session, [r.arrival, r.arrival, 0])
        span[1] = max(span[1], r.arrival)
        span[2] = max(span[2], r.prompt_tokens - shared)
    # Starts before ends at the same instant: a one-request session still counts.
    edges = sorted([(a, 0, size) for a, _, size in spans.values()]
                   + [(b, 1, -size) for _, b, size in spans.values()])
    live = peak = 0.0
    for _, _, change in edges:
        live += change
        peak = max(peak, live)
    return int(peak) + shared


def profile(workload: Workload) -> WorkloadProfile:
    """Measure ``workload`` (requests by nominal arrival; later bank-coding turns assume every
    answer streamed at the nominal decode rate, with no queueing)."""
    requests = workload.requests
    if not requests:
        raise ValueError(f"workload {workload.name} has no requests")
    tokens = [r.prompt_tokens for r in requests]  # a sum over segments: once per request
    by_session: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
        by_session.setdefault(request.session, []).append(i)
    growth: list[float] = []
    gaps: list[float] = []
    extended = 0
    for turns in by_session.values():
        for previous, later in pairwise(turns):
            growth.append(tokens[later] - tokens[previous])
            gaps.append(requests[later].arrival - requests[previous].arrival)
            extended += _extends(requests[previous], requests[later])
    shared = _shared_prefix(requests)
    # Block-granular (a trace): the next block differs somewhere, but may still begin alike;
    # exact when some prompt ends right there.
    resolution = int(workload.describe.get("block_tokens", 1))
    if min(tokens) <= shared:
        resolution = 1
    return WorkloadProfile(
        requests=len(requests),
        span_s=requests[-1].arrival - requests[0].arrival,
        sessions=len(by_session),
        sessions_from=str(workload.describe.get("sessions_from", "workload")),
        shared_prefix_tokens=shared,
        shared_prefix_resolution=resolution,
        prompt_tokens=Spread.of(tokens),
        first_prompt_tokens=Spread.of([tokens[t[0]] for t in by_session.values()]),
        turns=Spread.of([len(t) for t in by_session.values()]),
        growth_tokens=Spread.of(growth),
        gap_s=Spread.of(gaps),
        answer_tokens=Spread.of([r.max_tokens for r in requests]),
        extends_previous=extended / len(gaps) if gaps else 1.0,
        peak_working_set_tokens=peak_working_set(requests, shared),
    )


def _spread(s: Spread, unit: str = "") -> str:
    return f"{s.p50:,.0f}{unit} / {s.mean:,.0f}{unit} / {s.p90:,.0f}{unit}"


def _shared(p: WorkloadProfile) -> str:
    if p.shared_prefix_resolution <= 1:
        return f"{p.shared_prefix_tokens:,}"
    low = p.shared_prefix_tokens
    return f"{low:,} to {low + p.shared_prefix_resolution - 1:,}"


# (row label, how to show it, the bank-coding flags that set it)
_ROWS = (
    ("requests", lambda p: f"{p.requests:,}", "--sessions, --turns-mean"),
    ("span", lambda p: f"{p.span_s:,.0f} s", "--duration-s"),
    ("sessions", lambda p: f"{p.sessions:,}" + (
        f" ({p.sessions_from})" if p.sessions_from != "workload" else ""), "--sessions"),
    ("shared prefix (every request), tokens", _shared, "--system-tokens"),
    ("prompt tokens p50 / mean / p90", lambda p: _spread(p.prompt_tokens), ""),
    ("first prompt of a session p50 / mean / p90", lambda p: _spread(p.first_prompt_tokens),
     "--context-*, --system-tokens"),
    ("turns per session p50 / mean / largest",
     lambda p: f"{p.turns.p50:.0f} / {p.turns.mean:.2f} / {p.turns.largest:.0f}",
     "--turns-mean, --turns-max"),
    ("tokens added per turn p50 / mean / p90", lambda p: _spread(p.growth_tokens),
     "--question-*, --answer-*"),
    ("gap between turns p50 / mean / p90", lambda p: _spread(p.gap_s, " s"),
     "--think-*, answer x --decode-s-per-token"),
    ("answer tokens p50 / mean / p90", lambda p: _spread(p.answer_tokens), "--answer-*"),
    ("later turns extending the previous prompt",
     lambda p: f"{100 * p.extends_previous:.1f} %", ""),
    ("peak working set (sessions in progress), tokens",
     lambda p: f"{p.peak_working_set_tokens / 1e6:,.1f}M", "--sessions, --context-*"),
)


def markdown_profiles(profiles: dict[str, WorkloadProfile]) -> str:
    """One column per workload, one row per shape, and the bank-coding flags behind each."""
    names = list(profiles)
    rows = ["| shape | " + " | ".join(names) + " | bank-coding flags |",
            "|---|" + "---:|" * len(names) + "---|"]
    for label, show, flags in _ROWS:
        cells = " | ".join(show(profiles[n]) for n in names)
        rows.append(f"| {label} | {cells} | {f'`{flags}`' if flags else ''} |")
    return "\n".join(rows) + "\n"
