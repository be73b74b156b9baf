"""Where a P/D run's TTFT tail comes from, per path (remote or skipped) and per engine role
(issue 43; docs/journal/pd.md).

    python -m simulator.pd_probe OUT.json -- --jobs 1 --quiet --pd 4:12 \
        --workload agentic-coding --sessions 960 --modes pd-kvgate --hbm-residency on --no-oracle

(the arguments after `--` are `kvgate simulate`'s; `--jobs 1`, since the probe wraps this
process's classes). A diagnostic kept for the journal's measurements. Before `--`:
`--raw-lacking` gives the decider no block size, so it compares the KV events' tokens with the
estimated prompt raw, as before the lacking-unit fix; `--oracle-pick` sends each remote turn to
the prefill engine whose real queue ends first (what a perfect queue estimate would pick).
Without them it wraps the decider and the simulation and changes no decision. It writes to
OUT.json, over the measured turns:
- per path: turns, TTFT p50/p90/p99, and the mean of each part of the TTFT: the prefill
  engine's wait (its DDR read and queue), its prefill, the pull, the decode engine's queue wait
  and its prefill (a skipped turn's lacking tokens, a remote turn's last token);
- per role and 300 s window: turns admitted, mean and max queue wait, prefill seconds;
- per prefill engine: remote turns, their mean wait, its prefill seconds;
- the slowest 1 % of turns: their paths, the same parts, lacking tokens, and engines;
- remote turns by the decider's estimate of the picked prefill engine's queue: the real wait.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchkit.report import percentile
from kvgate.pd.decider import Plan, PrefillDecider
from simulator.command import add_arguments, run
from simulator.pd_simulation import PdSimulation

WINDOW_S = 300.0
PARTS = ("prefill_wait_s", "prefill_s", "pull_s", "decode_wait_s", "decode_prefill_s")


@dataclass
class Turn:
    """One turn as the probe saw it; times in emulated seconds."""

    path: str
    lacking: int
    prompt: int  # real tokens
    decode: int = -1
    prefill: int = -1
    arrival: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    computed: dict[str, float] = field(default_factory=dict)  # role -> tokens computed
    ttft: float = 0.0
    measured: bool = False
    queue_estimate: float = -1.0  # the decider's queue for the prefill engine it picked


@dataclass
class Probe:
    oracle_pick: bool = False  # pick the prefill engine whose real queue ends first
    sim: PdSimulation | None = None
    last_plan: Plan | None = None
    last_queue: float = -1.0
    turns: dict[int, Turn] = field(default_factory=dict)
    admitted: dict[str, list[tuple[float, float, float]]] = field(
        default_factory=lambda: defaultdict(list))  # role -> (admit, wait, prefill seconds)
    pulled_at: dict[int, float] = field(default_factory=dict)


def _wrap(probe: Probe, raw_lacking: bool) -> None:
    plan = PrefillDecider.plan

    def plan_probe(self: PrefillDecider, *a: Any, **k: Any) -> Plan:
        if raw_lacking:
            self._block_tokens = None
        probe.last_plan = plan(self, *a, **k)
        return probe.last_plan

    PrefillDecider.plan = plan_probe  # type: ignore[method-assign]
    pick = PrefillDecider._pick

    def pick_probe(self: PrefillDecider, pool: str) -> tuple[str, float] | None:
        picked = pick(self, pool)
        if probe.oracle_pick and picked is not None and probe.sim is not None:
            picked = _oracle(probe.sim, [m.address for m in self._directory.prefillers(pool)])
        probe.last_queue = -1.0 if picked is None else picked[1]
        return picked

    PrefillDecider._pick = pick_probe  # type: ignore[method-assign]
    send = PdSimulation._send

    arrival = PdSimulation._on_arrival

    async def arrival_probe(self: PdSimulation) -> None:
        probe.sim = self
        await arrival(self)

    PdSimulation._on_arrival = arrival_probe  # type: ignore[method-assign]

    def send_probe(self: PdSimulation, e: int, i: int, ask: Any, hashes: Any,
                   now: float) -> None:
        last = probe.last_plan
        remote = e < self.prefillers
        probe.turns[i] = Turn("remote" if remote else "skipped",
                              0 if last is None else last.lacking_tokens, ask.tokens,
                              arrival=now, measured=self.measured[i],
                              queue_estimate=probe.last_queue)
        probe.last_plan, probe.last_queue = None, -1.0
        send(self, e, i, ask, hashes, now)

    PdSimulation._send = send_probe  # type: ignore[method-assign,assignment]
    _wrap_place(probe)


def _oracle(sim: PdSimulation, addresses: list[str]) -> tuple[str, float]:
    """The prefill engine whose real prefill queue ends first, and that queue."""
    now = sim.now
    waits = {a: sim.fleet.engines[sim.index[a]]._prefill_start(now) - now for a in addresses}
    best = min(addresses, key=waits.__getitem__)
    return best, waits[best]


def _wrap_place(probe: Probe) -> None:
    place = PdSimulation._place
    pulled = PdSimulation._on_pulled

    def pulled_probe(self: PdSimulation, event: Any, at: float) -> None:
        probe.pulled_at[event[3]] = at
        pulled(self, event, at)

    def place_probe(self: PdSimulation, e: int, i: int, admission: Any, ask: Any) -> None:
        turn = probe.turns.get(i)
        if turn is not None:
            _record(probe, turn, self.prefillers, e, i, admission)
        place(self, e, i, admission, ask)

    PdSimulation._on_pulled = pulled_probe  # type: ignore[method-assign]
    PdSimulation._place = place_probe  # type: ignore[method-assign]


def _record(probe: Probe, turn: Turn, prefillers: int, e: int, i: int, admission: Any) -> None:
    s = admission.slot
    computed = admission.prompt_tokens - admission.hbm_hit_tokens - admission.ddr_hit_tokens
    prefill_s = s.first_token - s.prefill_start
    if e < prefillers:
        turn.prefill = e
        turn.parts["prefill_wait_s"] = s.prefill_start - turn.arrival
        turn.parts["prefill_s"] = prefill_s
        turn.computed["prefill"] = computed
        probe.admitted["prefill"].append((turn.arrival, s.prefill_start - turn.arrival,
                                          prefill_s))
        return
    turn.decode = e
    start = probe.pulled_at.pop(i, turn.arrival)
    if turn.path == "remote":
        turn.parts["pull_s"] = start - turn.arrival - turn.parts["prefill_wait_s"] \
            - turn.parts["prefill_s"]
    turn.parts["decode_wait_s"] = s.prefill_start - start
    turn.parts["decode_prefill_s"] = prefill_s
    turn.computed["decode"] = computed
    turn.ttft = s.first_token - turn.arrival
    probe.admitted["decode"].append((start, s.prefill_start - start, prefill_s))


def _pct(values: list[float], q: float) -> float:
    return percentile(values, q) if values else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _parts(turns: list[Turn]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(turns)}
    ttft = [t.ttft for t in turns]
    out.update({f"ttft_p{q}_s": round(_pct(ttft, q), 3) for q in (50, 90, 99)})
    out.update({p: round(_mean([t.parts[p] for t in turns]), 3) for p in PARTS})
    out["lacking_mean"] = round(_mean([float(t.lacking) for t in turns]))
    estimated = [t for t in turns if t.queue_estimate >= 0 and t.path == "remote"]
    out["queue_estimate_mean_s"] = round(_mean([t.queue_estimate for t in estimated]), 3)
    out["queue_real_mean_s"] = round(_mean([t.parts["prefill_wait_s"] for t in estimated]), 3)
    out["prompt_mean"] = round(_mean([float(t.prompt) for t in turns]))
    for role in ("prefill", "decode"):
        out[f"{role}_computed_mean"] = round(_mean([t.computed.get(role, 0.0) for t in turns]))
    return out


def _windows(probe: Probe) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {}
    for role, rows in probe.admitted.items():
        by: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        for row in rows:
            by[int(row[0] // WINDOW_S)].append(row)
        out[role] = [{"t0": w * WINDOW_S, "n": len(r),
                      "wait_mean_s": round(_mean([x[1] for x in r]), 3),
                      "wait_max_s": round(max(x[1] for x in r), 3),
                      "prefill_s": round(sum(x[2] for x in r), 1)}
                     for w, r in sorted(by.items())]
    return out


def _estimates(turns: list[Turn]) -> list[dict[str, float]]:
    """Remote turns by the decider's queue estimate (bins of doubling width): the real wait."""
    by: dict[float, list[Turn]] = defaultdict(list)
    for t in turns:
        if t.path == "remote" and t.queue_estimate >= 0:
            edge = 0.5
            while t.queue_estimate >= edge and edge < 512:
                edge *= 2
            by[edge].append(t)
    return [{"estimate_below_s": edge, "n": len(ts),
             "estimate_mean_s": round(_mean([t.queue_estimate for t in ts]), 2),
             "real_mean_s": round(_mean([t.parts["prefill_wait_s"] for t in ts]), 2)}
            for edge, ts in sorted(by.items())]


def _per_prefill_engine(turns: list[Turn]) -> dict[int, dict[str, float]]:
    """Per prefill engine: remote turns, their mean wait and its prefill seconds."""
    by: dict[int, list[Turn]] = defaultdict(list)
    for t in turns:
        if t.prefill >= 0:
            by[t.prefill].append(t)
    return {e: {"n": len(ts),
                "wait_mean_s": round(_mean([t.parts["prefill_wait_s"] for t in ts]), 2),
                "prefill_s": round(sum(t.parts["prefill_s"] for t in ts), 1)}
            for e, ts in sorted(by.items())}


def summary(probe: Probe) -> dict[str, Any]:
    turns = [t for t in probe.turns.values() if t.measured and t.decode >= 0]
    p99 = _pct([t.ttft for t in turns], 99)
    tail = [t for t in turns if t.ttft >= p99]
    return {
        "turns": len(turns),
        "skipped_share": sum(t.path == "skipped" for t in turns) / max(1, len(turns)),
        "all": _parts(turns),
        "paths": {p: _parts([t for t in turns if t.path == p]) for p in ("remote", "skipped")},
        "tail": {"threshold_s": round(p99, 3), **_parts(tail),
                 "paths": dict(Counter(t.path for t in tail)),
                 "decode_engines": dict(sorted(Counter(t.decode for t in tail).items())),
                 "prefill_engines": dict(sorted(Counter(t.prefill for t in tail).items()))},
        "windows": _windows(probe),
        "prefill_engines": _per_prefill_engine(turns),
        "queue_estimates": _estimates(turns),
    }


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[argv.index("--") + 1:]
    mine = argv[: argv.index("--")]
    probe = Probe(oracle_pick="--oracle-pick" in mine)
    _wrap(probe, "--raw-lacking" in mine)
    if rest and rest[0] == "simulate":
        rest = rest[1:]
    parser = argparse.ArgumentParser(prog="python -m simulator.pd_probe OUT.json --")
    add_arguments(parser)
    code = run(parser.parse_args(rest))
    with open(out, "w") as f:
        json.dump(summary(probe), f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
