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
import dataclasses
import json
import sys
from collections import Counter, defaultdict
from typing import Any

from emulator.engine_model import EngineModel
from kvgate.placement.pick import candidates
from kvgate.routing.gated import GatedPolicy
from simulator.command import add_arguments, run
from simulator.routing import AffinityRouter
from simulator.simulation import Simulation

WINDOW_S = 300.0
_last_admit: list[float] = [0.0]
# i, e, arrival, admit, prefill start, first token, tokens computed, tokens read from DDR
_rows: list[tuple[int, int, float, float, float, float, float, int]] = []
_board_at: dict[int, float] = {}  # request index -> board backlog of its engine pre-decision
_gate: Counter[str] = Counter()
_place_free: Counter[int] = Counter()
_place_gap: list[float] = []
_pending: dict[str, Any] = {}
_moves: list[tuple[float, str, str]] = []


def _wrap() -> None:
    admit = EngineModel.admit

    def admit_probe(self: EngineModel, now: float, *a: Any, **k: Any) -> Any:
        _last_admit[0] = now
        return admit(self, now, *a, **k)

    EngineModel.admit = admit_probe  # type: ignore[method-assign]

    place_sim = Simulation._place

    def place_probe(self: Simulation, e: int, i: int, admission: Any, ask: Any) -> None:
        s = admission.slot
        _rows.append((i, e, s.arrival, _last_admit[0], s.prefill_start, s.first_token,
                      float(admission.prompt_tokens - admission.hbm_hit_tokens
                            - admission.ddr_hit_tokens), admission.ddr_hit_tokens))
        place_sim(self, e, i, admission, ask)

    Simulation._place = place_probe  # type: ignore[method-assign]

    send = Simulation._send

    def send_probe(self: Simulation, e: int, i: int, ask: Any, hashes: Any, now: float) -> None:
        board = _pending.pop("board", None)
        if board is not None:
            _board_at[i] = board[self.addresses[e]]
        send(self, e, i, ask, hashes, now)

    Simulation._send = send_probe  # type: ignore[method-assign]

    route = AffinityRouter.route

    async def route_probe(self: AffinityRouter, ask: Any, now: float) -> str | None:
        policy = self._policy
        if isinstance(policy, GatedPolicy):
            board = policy.board
            _pending["board"] = {a: board.backlog_s(a, now)
                                 for a in self._members.active}
            _pending["now"] = now
        return await route(self, ask, now)

    AffinityRouter.route = route_probe  # type: ignore[method-assign]
    _wrap_gate()


def _wrap_gate() -> None:
    reconsider = GatedPolicy.reconsider

    def reconsider_probe(self: GatedPolicy, placing: Any, endpoint: str, state: Any,
                         known: Any) -> Any:
        moved = reconsider(self, placing, endpoint, state, known)
        config, now = self.config, known.now
        moved_at = None if known.seen is None else known.seen.moved_at
        if moved is not None:
            _gate[f"moved:{moved.reason.name}"] += 1
            _moves.append((now, endpoint, moved.endpoint))
        elif moved_at is not None and now - moved_at < config.cooldown_s:
            _gate["cooldown"] += 1
        else:
            backlog = self.board.backlog_s(endpoint, now)
            if backlog < config.min_saving_s:
                _gate["under_min_saving_s"] += 1
            else:
                self.config = dataclasses.replace(config, miss_safe=False)
                try:
                    loose = self.move(placing, endpoint, backlog, known)
                    self.config = dataclasses.replace(config, miss_safe=False,
                                                      min_saving_ratio=0.0)
                    no_ratio = self.move(placing, endpoint, backlog, known)
                finally:
                    self.config = config
                if loose is not None:
                    _gate["refused_miss_safe"] += 1
                elif no_ratio is not None:
                    _gate["refused_min_saving_ratio"] += 1
                else:
                    _gate["refused_no_saving"] += 1
        return moved

    GatedPolicy.reconsider = reconsider_probe  # type: ignore[method-assign]

    place = GatedPolicy.place

    def place_probe(self: GatedPolicy, placing: Any, known: Any, *, prefer_kv_pool: Any,
                    exclude: Any) -> Any:
        free = list(candidates(placing.view, placing.hash_value, placing.loads,
                               placing.load_factor, prefer_kv_pool=prefer_kv_pool,
                               exclude=exclude))
        _place_free[len(free)] += 1
        best = place(self, placing, known, prefer_kv_pool=prefer_kv_pool, exclude=exclude)
        board = _pending.get("board")
        if best is not None and board:
            _place_gap.append(board[best] - min(board.values()))
            _gate["placed"] += 1
            if best not in free[: self.config.candidates]:
                _gate["placed_outside_candidates"] += 1
            if min(board, key=board.__getitem__) not in free[: self.config.candidates]:
                _gate["least_loaded_not_a_candidate"] += 1
            if known.seen is not None:
                _gate["placed_rebound"] += 1
        return best

    GatedPolicy.place = place_probe  # type: ignore[method-assign]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary(warmup_s: float) -> dict[str, Any]:
    rows = [r for r in _rows if r[2] >= warmup_s]
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
    p99 = _pct(ttft, 99)
    tail = [r for r in rows if r[5] - r[2] >= p99]
    tail_engines = Counter(r[1] for r in tail)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    real = {r[0]: r[4] - r[3] for r in rows}
    pairs = [(_board_at[i], real[i]) for i in real if i in _board_at]
    return {
        "requests": len(rows), "ttft_p99_s": p99,
        "ttft_p50_s": _pct(ttft, 50),
        "tail": {"n": len(tail), "read_wait_s": mean([r[3] - r[2] for r in tail]),
                 "queue_wait_s": mean([r[4] - r[3] for r in tail]),
                 "prefill_s": mean([r[5] - r[4] for r in tail]),
                 "computed_tokens": mean([r[6] for r in tail]),
                 "ddr_tokens": mean([float(r[7]) for r in tail]),
                 "engines": dict(sorted(tail_engines.items()))},
        "all": {"read_wait_s": mean([r[3] - r[2] for r in rows]),
                "queue_wait_s": mean([r[4] - r[3] for r in rows]),
                "queue_wait_p99_s": _pct([r[4] - r[3] for r in rows], 99),
                "ddr_tokens": mean([float(r[7]) for r in rows]),
                "prefill_s": mean([r[5] - r[4] for r in rows])},
        "per_engine_requests": dict(sorted(Counter(r[1] for r in rows).items())),
        "per_engine_prefill_s": {e: round(sum(r[5] - r[4] for r in rows if r[1] == e), 1)
                                 for e in engines},
        "per_engine_queue_wait_mean_s": {
            e: round(mean([r[4] - r[3] for r in rows if r[1] == e]), 3) for e in engines},
        "windows": per_window,
        "gate": dict(_gate),
        "place_free_candidates": dict(sorted(_place_free.items())),
        "place_backlog_over_least_s": {"mean": mean(_place_gap), "p90": _pct(_place_gap, 90),
                                       "p99": _pct(_place_gap, 99)},
        "estimate_vs_real": {"n": len(pairs), "estimate_mean_s": mean([p[0] for p in pairs]),
                             "real_mean_s": mean([p[1] for p in pairs]),
                             "estimate_over_1s": sum(1 for p in pairs if p[0] > 1.0),
                             "real_when_estimate_over_1s": mean(
                                 [p[1] for p in pairs if p[0] > 1.0])},
    }


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[argv.index("--") + 1:]
    _wrap()
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
        json.dump(summary(warmup), f, indent=1)
    if "--raw" in argv[: argv.index("--")]:
        with open(out + ".raw.json", "w") as f:
            json.dump({"rows": _rows, "board": _board_at, "moves": _moves}, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
