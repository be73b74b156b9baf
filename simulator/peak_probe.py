"""Where a simulated run's TTFT tail comes from, per engine and per gate decision (issue 42).

    python -m simulator.peak_probe OUT.json -- --jobs 1 --quiet --sessions 12800 \
        --modes affinity+ddr --no-oracle

(the arguments after `--` are `kvgate simulate`'s; `--jobs 1`, since the probe wraps this
process's classes). A diagnostic kept for the journal's measurements: its tallies are this
process's, for one run.

`--raw` (before `--`) also writes OUT.json.raw.json: every request's row, the board's estimate
per request and every move. It wraps the simulator's engine model and the load gate (no
behaviour changes) and writes to OUT.json:
- per engine, per 300 s window: requests admitted, prefill seconds, mean queue wait;
- the slowest 1 % of requests (by TTFT): their DDR read wait, queue wait and prefill, tokens
  computed and read from DDR, and on which engines they fell;
- the gate's bound sessions: how many were reconsidered, held by cooldown, under
  `min_saving_s`, refused by the saving rule or by `miss_safe`, moved;
- new placements: how many ring candidates were under the load bound, and the chosen engine's
  board backlog against the least on the fleet;
- the board's backlog for the chosen engine at each decision against the real queue wait.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from kvgate.placement.pick import candidates
from kvgate.routing.gated import GatedPolicy
from simulator.command import add_arguments, run
from simulator.probe_hooks import on_admit, on_place, on_send, pct
from simulator.routing import AffinityRouter
from simulator.simulation import Simulation

WINDOW_S = 300.0
# i, e, arrival, admit, prefill start, first token, tokens computed, tokens read from DDR
Row = tuple[int, int, float, float, float, float, float, int]


@dataclass
class Probe:
    """What the wrappers hear during one run."""

    last_admit: float = 0.0
    rows: list[Row] = field(default_factory=list)
    # request index -> its engine's board backlog before the decision
    board_at: dict[int, float] = field(default_factory=dict)
    gate: Counter[str] = field(default_factory=Counter)
    place_free: Counter[int] = field(default_factory=Counter)
    place_gap: list[float] = field(default_factory=list)
    pending: dict[str, Any] = field(default_factory=dict)  # the request being routed
    moves: list[tuple[float, str, str]] = field(default_factory=list)


def _wrap(probe: Probe) -> None:
    """Wraps this process's classes to report to `probe`."""
    _wrap_admit(probe)
    _wrap_place(probe)
    _wrap_send(probe)
    _wrap_route(probe)
    _wrap_reconsider(probe)
    _wrap_gate_place(probe)


def _wrap_admit(probe: Probe) -> None:
    on_admit(probe)


def _wrap_place(probe: Probe) -> None:
    def record(sim: Simulation, e: int, i: int, admission: Any) -> None:
        s = admission.slot
        probe.rows.append((i, e, s.arrival, probe.last_admit, s.prefill_start, s.first_token,
                           float(admission.prompt_tokens - admission.hbm_hit_tokens
                                 - admission.ddr_hit_tokens), admission.ddr_hit_tokens))

    on_place(record)


def _wrap_send(probe: Probe) -> None:
    def record(sim: Simulation, e: int, i: int) -> None:
        board = probe.pending.pop("board", None)
        if board is not None:
            probe.board_at[i] = board[sim.addresses[e]]

    on_send(record)


def _wrap_route(probe: Probe) -> None:
    route = AffinityRouter.route

    async def route_probe(self: AffinityRouter, ask: Any, now: float) -> str | None:
        policy = self._policy
        if isinstance(policy, GatedPolicy):
            board = policy.board
            probe.pending["board"] = {a: board.backlog_s(a, now)
                                      for a in self._members.active}
            probe.pending["now"] = now
        return await route(self, ask, now)

    AffinityRouter.route = route_probe  # type: ignore[method-assign]


def _wrap_reconsider(probe: Probe) -> None:
    reconsider = GatedPolicy.reconsider

    def reconsider_probe(self: GatedPolicy, placing: Any, endpoint: str, state: Any,
                         known: Any) -> Any:
        moved = reconsider(self, placing, endpoint, state, known)
        config, now = self.config, known.now
        moved_at = None if known.seen is None else known.seen.moved_at
        if moved is not None:
            probe.gate[f"moved:{moved.reason.name}"] += 1
            probe.moves.append((now, endpoint, moved.endpoint))
        elif config.cooling(moved_at, now):
            probe.gate["cooldown"] += 1
        else:
            probe.gate[_why_stayed(self, placing, endpoint, known)] += 1
        return moved

    GatedPolicy.reconsider = reconsider_probe  # type: ignore[method-assign]


def _why_stayed(gate: GatedPolicy, placing: Any, endpoint: str, known: Any) -> str:
    """Why a session out of cooldown stayed on `endpoint`: under `min_saving_s`, refused by
    `miss_safe`, by `min_saving_ratio`, or no sibling saves enough."""
    config, now = gate.config, known.now
    backlog = gate.board.backlog_s(endpoint, now)
    if not config.clears(backlog, 0.0):  # a move saves at most the backlog (min_saving_s >= 0)
        return "under_min_saving_s"
    gate.config = config.without_miss_safe()
    try:
        loose = gate.move(placing, endpoint, backlog, known)
        gate.config = config.without_miss_safe().without_saving_ratio()
        no_ratio = gate.move(placing, endpoint, backlog, known)
    finally:
        gate.config = config
    if loose is not None:
        return "refused_miss_safe"
    if no_ratio is not None:
        return "refused_min_saving_ratio"
    return "refused_no_saving"


def _wrap_gate_place(probe: Probe) -> None:
    place = GatedPolicy.place

    def place_probe(self: GatedPolicy, placing: Any, known: Any, *, prefer_kv_pool: Any,
                    exclude: Any) -> Any:
        free = list(candidates(placing.view, placing.hash_value, placing.loads,
                               placing.load_factor, prefer_kv_pool=prefer_kv_pool,
                               exclude=exclude))
        probe.place_free[len(free)] += 1
        best = place(self, placing, known, prefer_kv_pool=prefer_kv_pool, exclude=exclude)
        board = probe.pending.get("board")
        gate = probe.gate
        if best is not None and board:
            probe.place_gap.append(board[best] - min(board.values()))
            gate["placed"] += 1
            if best not in self.config.scored(free):
                gate["placed_outside_candidates"] += 1
            if min(board, key=board.__getitem__) not in self.config.scored(free):
                gate["least_loaded_not_a_candidate"] += 1
            if known.seen is not None:
                gate["placed_rebound"] += 1
        return best

    GatedPolicy.place = place_probe  # type: ignore[method-assign]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summary(probe: Probe, warmup_s: float) -> dict[str, Any]:
    rows = [r for r in probe.rows if r[2] >= warmup_s]
    engines = sorted({r[1] for r in rows})
    windows: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(
        lambda: [0.0, 0.0, 0.0]))
    for _, e, arr, adm, ps, ft, _computed, _read in rows:
        cell = windows[int(arr // WINDOW_S)][e]
        cell[0] += 1
        cell[1] += ft - ps
        cell[2] += ps - adm
    per_window = []
    for w in sorted(windows):
        busy = [windows[w][e][1] for e in engines]
        waits = [windows[w][e][2] / windows[w][e][0] if windows[w][e][0] else 0.0
                 for e in engines]
        per_window.append({
            "t0": w * WINDOW_S, "requests": sum(windows[w][e][0] for e in engines),
            "prefill_s_mean": sum(busy) / len(busy), "prefill_s_max": max(busy),
            "prefill_s_min": min(busy), "wait_s_mean": sum(waits) / len(waits),
            "wait_s_max": max(waits), "wait_s_min": min(waits)})
    ttft = [r[5] - r[2] for r in rows]
    p99 = pct(ttft, 99)
    tail = [r for r in rows if r[5] - r[2] >= p99]
    tail_engines = Counter(r[1] for r in tail)

    real = {r[0]: r[4] - r[3] for r in rows}
    pairs = [(probe.board_at[i], real[i]) for i in real if i in probe.board_at]
    return {
        "requests": len(rows), "ttft_p99_s": p99,
        "ttft_p50_s": pct(ttft, 50),
        "tail": {"n": len(tail), "read_wait_s": _mean([r[3] - r[2] for r in tail]),
                 "queue_wait_s": _mean([r[4] - r[3] for r in tail]),
                 "prefill_s": _mean([r[5] - r[4] for r in tail]),
                 "computed_tokens": _mean([r[6] for r in tail]),
                 "ddr_tokens": _mean([float(r[7]) for r in tail]),
                 "engines": dict(sorted(tail_engines.items()))},
        "all": {"read_wait_s": _mean([r[3] - r[2] for r in rows]),
                "queue_wait_s": _mean([r[4] - r[3] for r in rows]),
                "queue_wait_p99_s": pct([r[4] - r[3] for r in rows], 99),
                "ddr_tokens": _mean([float(r[7]) for r in rows]),
                "prefill_s": _mean([r[5] - r[4] for r in rows])},
        "per_engine_requests": dict(sorted(Counter(r[1] for r in rows).items())),
        "per_engine_prefill_s": {e: round(sum(r[5] - r[4] for r in rows if r[1] == e), 1)
                                 for e in engines},
        "per_engine_queue_wait_mean_s": {
            e: round(_mean([r[4] - r[3] for r in rows if r[1] == e]), 3) for e in engines},
        "windows": per_window,
        "gate": dict(probe.gate),
        "place_free_candidates": dict(sorted(probe.place_free.items())),
        "place_backlog_over_least_s": {"mean": _mean(probe.place_gap),
                                       "p90": pct(probe.place_gap, 90),
                                       "p99": pct(probe.place_gap, 99)},
        "estimate_vs_real": {"n": len(pairs), "estimate_mean_s": _mean([p[0] for p in pairs]),
                             "real_mean_s": _mean([p[1] for p in pairs]),
                             "estimate_over_1s": sum(1 for p in pairs if p[0] > 1.0),
                             "real_when_estimate_over_1s": _mean(
                                 [p[1] for p in pairs if p[0] > 1.0])},
    }


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[argv.index("--") + 1:]
    probe = Probe()
    _wrap(probe)
    if rest and rest[0] == "simulate":
        rest = rest[1:]
    parser = argparse.ArgumentParser(prog="python -m simulator.peak_probe OUT.json --")
    add_arguments(parser)
    code = run(parser.parse_args(rest))
    warmup = 0.0
    if "--duration-s" in rest:
        warmup = float(rest[rest.index("--duration-s") + 1]) * 0.1
    else:
        warmup = 360.0  # the committed runs' warmup_s
    with open(out, "w") as f:
        json.dump(summary(probe, warmup), f, indent=1)
    if "--raw" in argv[: argv.index("--")]:
        with open(out + ".raw.json", "w") as f:
            json.dump({"rows": probe.rows, "board": probe.board_at, "moves": probe.moves},
                      f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
