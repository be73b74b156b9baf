"""CPU per sticky decision in-process, with the load gate off and on: no transport, the core's
RequestHandler and Pipeline (kvgate.routing) over an in-memory store, 4 engines in one DDR
pool.

    python bench/decision_cost.py [--decisions 200000] [--sessions 1000] [--board-from-reports]
                                  [--cases round,round+hbm,round+estimate]
                                  [--chunks 20 [--gate-only]] [--calls]

`--board-from-reports`: the gate-on runs with `placement.load_gate.board_from_reports`;
`--cases`: only these (`off`, or the gate on with one of the engine figures below);
`--chunks N`: the cases take turns in one process, chunk by chunk, and each prints its least
and median chunk (on a busy machine the least is the figure that compares); `--calls`: the
Python function calls per decision instead of its time (a count no load moves);
`--gate-only` (with `--chunks`): the policy's part of a sticky turn alone (what it knows,
`reconsider`, its booking hooks), the part the cases differ in.

Every session is bound first; each measured request carries `content-length: 2000`, so with the
gate on it is sized and booked on the ledger (engines priced as instant: no backlog builds, the
sticky path under the gate's threshold is what is measured). With the gate on, three ways
the engines' figures reach the board: none, put one by one (a scrape), or one collector round
kept as columns (kvgate.placement.live.ObservedRound), each engine made on first read; and the
round with HBM residency from the engines' KV events (kvgate.fleet.hbm_board.HbmBoard: every
session's context in its engine's HBM, every engine's eviction rate known), which prices the
stay and asks whether to re-home; and that with the prefix step on
(`placement.load_gate.prefix_placement`: its booking hook on every decision, no lookup), each
request decided as ext_proc's prefix-step stream decides it (its prompt readable: a sticky turn
is answered without it); and the round with no KV events but the gate's estimate of what each
engine's HBM holds (`placement.load_gate.hbm_estimate: routed`: every session held, its turn
recorded on every decision, each re-home asked).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.config import load_text
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.states import EndpointState
from kvgate.contract.vllm import GAUGES, EngineFigures
from kvgate.endpoints import EndpointDirectory
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard, ObservedLoad, ObservedRound
from kvgate.routing import Pipeline, build_policy
from kvgate.routing.handler import DecisionMetrics, RequestHandler
from kvgate.routing.policy import Placing, Policy
from kvgate.routing.sources import SessionSources
from kvgate.session import normalize_session

CONFIG = load_text("pools: [{name: p, kv_pool: a, endpoints: "
                   "[10.0.0.1:1, 10.0.0.2:1, 10.0.0.3:1, 10.0.0.4:1]}]\n")


ENGINES = [e.key for e in CONFIG.pools[0].endpoints]
FIGURES = ("none", "scraped", "round", "round+hbm", "round+hbm+prefix", "round+estimate")


def board_with(figures: str) -> LoadBoard:
    """A board with no figures, each engine's put one by one (a scrape, or a collector before
    the columns), or one collector round kept as columns; every queue empty, every figure
    fresh for the whole run (read an hour from now)."""
    board, at = LoadBoard(), time.monotonic() + 3600
    if figures == "scraped":
        for engine in ENGINES:
            board.observe(engine, ObservedLoad(at, figures=EngineFigures.of(running=1,
                                                                            kv_usage=0.5)))
    elif figures.startswith("round"):
        count = len(ENGINES)
        columns: dict[str, list[float]] = {"waiting": [0] * count, "running": [1] * count,
                                           "kv_usage": [0.5] * count}
        board.observe_round(ObservedRound({e: i for i, e in enumerate(ENGINES)}, at,
                                          [0.0] * count, [columns[g.name] for g in GAUGES],
                                          0.1))
    return board


def resident(sessions: int) -> HbmBoard:
    """Every session's context whole in every engine's HBM, every engine evicting."""
    keys = [normalize_session(f"bench-{i}".encode()) for i in range(sessions)]
    board = HbmBoard()
    board.apply(pb.FleetLoad(
        loads=pb.EngineLoads(endpoint=ENGINES, eviction_rate=[10.0] * len(ENGINES)),
        residency=[pb.SessionResidency(endpoint=e, session=k, tokens=100_000)
                   for e in ENGINES for k in keys if k is not None]))
    return board


def _gate(on: bool, prefix: bool, reports: bool = False, estimate: bool = False
          ) -> GateConfig:
    """The gate as a config file sets it: on or off, with the prefix step or without, with
    the estimate of what HBM holds (`hbm_estimate`) or without."""
    words = (f"{{enabled: {str(on).lower()}, prefix_placement: {str(prefix).lower()}, "
             f"board_from_reports: {str(reports).lower()}, "
             f"hbm_estimate: {'routed' if estimate else 'none'}}}")
    return load_text(f"placement: {{load_gate: {words}}}\n",
                     require_pools=False).placement.load_gate


class Sticky:
    """One case: its handler, every session bound, deciding sticky turns in order."""

    def __init__(self, gate_on: bool, sessions: int, figures: str, reports: bool) -> None:
        self.prefix = figures.endswith("+prefix")
        self.handler, self.policy = _handler(gate_on, sessions, figures, reports)
        self.headers = [{"x-session-id": f"bench-{i}".encode(), "content-length": b"2000"}
                        for i in range(sessions)]
        self.bound: list[tuple[str, str]] = []  # each session and its endpoint
        self.turn = 0

    async def bind(self) -> None:
        for one in self.headers:
            decision = await self.handler.decide(None, one, None)
            session = normalize_session(one["x-session-id"])
            assert session is not None and decision.endpoints
            self.bound.append((session, decision.endpoints[0]))

    def gate_seconds(self, decisions: int) -> float:
        """CPU seconds per sticky turn in the policy alone (what it knows, `reconsider`, its
        booking hooks), over the next `decisions`: no handler, pipeline or store."""
        policy, bound, start = self.policy, self.bound, self.turn
        placing = Placing(EndpointDirectory(CONFIG).view("p"), 0, {}, 1.25)
        tokens = 2000 // 4  # the handler's estimate of the body (4 bytes a token)
        started = time.process_time()
        for i in range(start, start + decisions):
            session, endpoint = bound[i % len(bound)]
            known = policy.known("p", session, tokens)
            policy.reconsider(placing, endpoint, EndpointState.ACTIVE, known)  # never moves:
            for hook in policy.hooks:  # every engine is instant
                hook.kept("p", session, endpoint, known)
        self.turn = start + decisions
        return (time.process_time() - started) / decisions

    async def seconds(self, decisions: int) -> float:
        """CPU seconds per sticky decision over the next `decisions`."""
        handler, headers, start = self.handler, self.headers, self.turn
        sessions = len(headers)
        started = time.process_time()
        if self.prefix:  # ext_proc.prompt_stream: every request may give its prompt; sticky
            for i in range(start, start + decisions):  # ones do not
                await handler.decide(None, headers[i % sessions], None, prompt=True)
        else:
            for i in range(start, start + decisions):
                await handler.decide(None, headers[i % sessions], None)
        self.turn = start + decisions
        return (time.process_time() - started) / decisions


async def per_decision(gate_on: bool, decisions: int, sessions: int,
                       figures: str = "none", reports: bool = False) -> float:
    """CPU seconds per sticky decision."""
    case = Sticky(gate_on, sessions, figures, reports)
    await case.bind()
    return await case.seconds(decisions)


async def interleaved(cases: Sequence[str], decisions: int, sessions: int, chunks: int,
                      reports: bool, gate_only: bool = False) -> dict[str, list[float]]:
    """Each case's CPU seconds per sticky decision in `chunks` runs of `decisions` / `chunks`,
    the cases taking turns chunk by chunk (a busy machine's noise falls on all alike);
    `gate_only`: the policy's part alone (`Sticky.gate_seconds`)."""
    runs = {case: Sticky(case != "off", sessions, "none" if case == "off" else case, reports)
            for case in cases}
    for run in runs.values():
        await run.bind()
    found: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(chunks):
        for case, run in runs.items():
            count = max(1, decisions // chunks)
            found[case].append(run.gate_seconds(count) if gate_only
                               else await run.seconds(count))
    return found


async def calls_per_decision(case: str, decisions: int, sessions: int, reports: bool
                             ) -> float:
    """Python function calls per sticky decision of `case` (builtins included)."""
    run = Sticky(case != "off", sessions, "none" if case == "off" else case, reports)
    await run.bind()
    profile = cProfile.Profile()
    profile.enable()
    await run.seconds(decisions)
    profile.disable()
    counts = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls: int = sum(entry[1] for entry in counts.values())  # (primitive calls, calls, ...)
    return calls / decisions


def _handler(gate_on: bool, sessions: int, figures: str, reports: bool
             ) -> tuple[RequestHandler, Policy]:
    prefix = figures.endswith("+prefix")
    policy = build_policy(_gate(gate_on, prefix, reports, figures.endswith("+estimate")),
                          EngineCost(prefill_tokens_per_s=1e9, prefill_overhead_s=0.0),
                          board_with(figures),
                          hbm=resident(sessions) if "+hbm" in figures else None,
                          block_tokens=16)
    pipeline = Pipeline(MemoryBindingStore(), EndpointDirectory(CONFIG), 1.25, policy=policy)
    return RequestHandler(pipeline, SessionSources(CONFIG.session), DecisionMetrics("bench"),
                          "p", bytes_per_token=4.0 if gate_on else None), policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--board-from-reports", action="store_true",
                        help="placement.load_gate.board_from_reports on in the gate-on runs")
    parser.add_argument("--cases", type=_cases, default=("off", *FIGURES),
                        help="comma-separated: off, " + ", ".join(FIGURES) + " (default: all)")
    parser.add_argument("--chunks", type=int, default=1,
                        help="over 1: the cases take turns in one process, each run in this "
                        "many chunks; each chunk's figure printed as the least and the median")
    parser.add_argument("--gate-only", action="store_true",
                        help="with --chunks: time the policy's part of a decision alone")
    parser.add_argument("--calls", action="store_true",
                        help="count the Python function calls per sticky decision instead "
                        "(cProfile's count: no load on a shared machine moves it)")
    args = parser.parse_args()
    if args.calls:
        for case in args.cases:
            calls = asyncio.run(calls_per_decision(case, args.decisions, args.sessions,
                                                   args.board_from_reports))
            print(f"{case:<18} {calls:7.2f} Python function calls per sticky decision")
        return
    if args.chunks > 1:
        _chunked(args.cases, args.decisions, args.sessions, args.chunks, args.board_from_reports,
                 args.gate_only)
        return
    _twice(args.cases, args.decisions, args.sessions, args.board_from_reports)


def _twice(cases: Sequence[str], decisions: int, sessions: int, reports: bool) -> None:
    """Each case in its own run, twice over."""
    runs = [(case != "off", "none" if case == "off" else case) for case in cases]
    for _ in range(2):
        costs = {}
        for gate_on, figures in runs:
            seconds = costs[figures if gate_on else "off"] = asyncio.run(per_decision(
                gate_on, decisions, sessions, figures, reports))
            what = f"on, engine figures: {figures}" if gate_on else "off"
            print(f"gate {what:<28} {seconds * 1e6:6.2f} us per sticky decision")
        # What HBM residency (KV events, or the estimate) adds to the same round without it.
        for case in ("round+hbm", "round+estimate"):
            if case in costs and "round" in costs:
                print(f"{case} / round: {costs[case] / costs['round']:.2f} "
                      f"(+{(costs[case] - costs['round']) * 1e6:.2f} us)")


def _chunked(cases: Sequence[str], decisions: int, sessions: int, chunks: int,
             reports: bool, gate_only: bool) -> None:
    found = asyncio.run(interleaved(cases, decisions, sessions, chunks, reports, gate_only))
    what = "in the policy alone" if gate_only else "per sticky decision"
    for case, seconds in found.items():
        print(f"{case:<18} least {min(seconds) * 1e6:6.2f} us, median "
              f"{statistics.median(seconds) * 1e6:6.2f} us {what} "
              f"({chunks} chunks of {max(1, decisions // chunks)})")
    if "round" in found:
        base = min(found["round"])
        for case in ("round+hbm", "round+estimate"):
            if case in found:
                print(f"{case} - round, least against least: "
                      f"{(min(found[case]) - base) * 1e6:+.2f} us")


def _cases(text: str) -> tuple[str, ...]:
    cases = tuple(c.strip() for c in text.split(",") if c.strip())
    unknown = [c for c in cases if c != "off" and c not in FIGURES]
    if unknown or not cases:
        raise argparse.ArgumentTypeError(f"unknown {unknown or 'nothing'}; "
                                         f"choose from off, {', '.join(FIGURES)}")
    return cases


if __name__ == "__main__":
    main()
