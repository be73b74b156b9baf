"""What the load gate predicted for a bound session's turn against what the turn then had
(issue 42, item 4): the estimates of staying and of the best DDR-pool sibling, and the
turn's real read wait, queue wait and TTFT where it went.

    python -m simulator.move_probe OUT.json -- --jobs 1 --quiet --modes affinity+ddr \
        --no-oracle [kvgate simulate flags...]

(`--jobs 1`: the probe wraps this process's classes; one mode, the gate's.) It changes no
decision. For every sticky turn the gate reconsiders (not in cooldown) it prices the best
sibling with no threshold and no `miss_safe`, so a stay has its counterfactual estimate too,
and records: the estimates (stay, best sibling), each side's board backlog, the booked link
wait at the sibling, the context's plain DDR read, whether the gate moved it; then the turn's
real figures from the engine model. OUT.json: the summary (`summary`); OUT.json.raw.json
with `--raw` (before `--`): every row, and how the ledger booked each request (its kind and
prefill seconds).

`--debias` (before `--`), a diagnostic rule, not the gate's (live, ext_proc never hears a
first token): a move must still save `min_saving_s` and `min_saving_ratio` once each estimate
is corrected by the mean error the run has measured so far for its side (real TTFT less the
estimate, over the moves and over the priced stays whose first token has passed; a running
mean as `PrefillMix` keeps). `--debias-below-defaults`: the same, except that a move the
default thresholds and `miss_safe` take is taken uncorrected.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.routing.booking import Ledger
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.moves import Move
from simulator.command import add_arguments, run
from simulator.probe_hooks import on_admit, on_place, on_send
from simulator.simulation import Simulation

# request index -> engine, arrival, admission, prefill start, first token, DDR tokens,
# measured, tokens computed, prompt tokens
Real = tuple[int, float, float, float, float, int, bool, int, int]


@dataclass
class Probe:
    """What the wrappers hear during one run, and the `--debias` rule's state."""

    debias: bool = False
    below_defaults: bool = False  # `--debias-below-defaults`
    last_admit: float = 0.0
    # what the gate and the ledger said about the request being placed, until it is sent
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: dict[int, dict[str, Any]] = field(default_factory=dict)  # the gate's figures
    # how the ledger booked each request (kept, placed new, re-placed in its DDR pool,
    # sessionless) and the prefill seconds it booked
    booked: dict[int, tuple[str, float]] = field(default_factory=dict)
    real: dict[int, Real] = field(default_factory=dict)
    # `--debias`: the running mean error (real TTFT less the estimate) of moves and of stays,
    # fed each turn's first token once the clock has passed it.
    bias: dict[str, PrefillMix] = field(
        default_factory=lambda: {"move": PrefillMix(), "stay": PrefillMix()})
    # first token, request, side, error: heard once the clock passes the first token
    heard: list[tuple[float, int, str, float]] = field(default_factory=list)


def _wrap(probe: Probe) -> None:
    """Wraps this process's classes to report to `probe`."""
    _wrap_admit(probe)
    _wrap_place(probe)
    _wrap_send(probe)
    _wrap_reconsider(probe)
    _wrap_book(probe)
    _wrap_kept(probe)
    _wrap_placed(probe)
    _wrap_move(probe)


def _wrap_admit(probe: Probe) -> None:
    on_admit(probe)


def _wrap_place(probe: Probe) -> None:
    def record(sim: Simulation, e: int, i: int, admission: Any) -> None:
        s = admission.slot
        decision = probe.decisions.get(i)
        if decision is not None:
            side = "move" if decision["moved"] else "stay"
            guess = decision["best_s"] if decision["moved"] else decision["stay_s"]
            heapq.heappush(probe.heard, (s.first_token, i, side,
                                         s.first_token - s.arrival - guess))
        probe.real[i] = (e, s.arrival, probe.last_admit, s.prefill_start, s.first_token,
                         admission.ddr_hit_tokens, bool(sim.measured[i]),
                         admission.prompt_tokens - admission.cached_tokens,
                         admission.prompt_tokens)

    on_place(record)


def _wrap_send(probe: Probe) -> None:
    def record(sim: Simulation, e: int, i: int) -> None:
        booked = probe.pending.pop("booked", None)
        if booked is not None:
            probe.booked[i] = (booked["kind"], booked["prefill_s"])
        decision = probe.pending.pop("decision", None)
        if decision is not None:
            decision["went"] = sim.addresses[e]
            probe.decisions[i] = decision

    on_send(record)


def _wrap_reconsider(probe: Probe) -> None:
    reconsider = GatedPolicy.reconsider

    def reconsider_probe(self: GatedPolicy, placing: Any, endpoint: str, state: Any,
                         known: Any) -> Any:
        probe.pending.pop("decision", None)
        moved = reconsider(self, placing, endpoint, state, known)
        config, now = self.config, known.now
        moved_at = None if known.seen is None else known.seen.moved_at
        if moved is None and config.cooling(moved_at, now):
            return moved
        backlog = self.board.backlog_s(endpoint, now)
        self.config = config.without_move_thresholds()
        try:
            loose = self.move(placing, endpoint, backlog, known)
        finally:
            self.config = config
        if loose is not None:
            probe.pending["decision"] = _figures(self, endpoint, backlog, loose, known,
                                                 moved is not None)
        return moved

    GatedPolicy.reconsider = reconsider_probe  # type: ignore[method-assign]


def _figures(gate: GatedPolicy, endpoint: str, backlog: float, loose: Move, known: Any,
             moved: bool) -> dict[str, Any]:
    """The gate's figures for a turn it reconsidered: staying on `endpoint` against `loose`,
    the best sibling priced with no threshold."""
    links, now = gate.links, known.now
    context = known.size.context_tokens
    seen = gate.board.observed(loose.endpoint, now)
    here = gate.board.observed(endpoint, now)
    return {
        "t": now, "from": endpoint, "best": loose.endpoint, "moved": moved,
        "stay_s": loose.stay_s, "best_s": loose.move_s, "backlog_s": backlog,
        "best_backlog_s": gate.board.backlog_s(loose.endpoint, now),
        "link_wait_s": None if links is None else links.wait_s(loose.endpoint, now),
        "read_s": gate.cost.transfer_s(context), "context": context,
        "prompt": known.size.prompt_tokens,
        "best_running": None if seen is None else seen.figures.running,
        "best_waiting": None if seen is None else seen.figures.waiting,
        "running": None if here is None else here.figures.running}


def _wrap_move(probe: Probe) -> None:
    move = GatedPolicy.move

    def move_debiased(self: GatedPolicy, placing: Any, current: str, backlog: float,
                      known: Any) -> Move | None:
        found = move(self, placing, current, backlog, known)
        if found is None or not probe.debias:
            return found
        if probe.below_defaults:  # what the default thresholds take is taken as they take it
            config = self.config
            self.config = config.with_default_move_thresholds()
            try:
                if move(self, placing, current, backlog, known) is not None:
                    return found
            finally:
                self.config = config
        while probe.heard and probe.heard[0][0] <= known.now:
            _, _, side, error = heapq.heappop(probe.heard)
            probe.bias[side].add(error)
        stay = found.stay_s + probe.bias["stay"].mean_s
        saving = stay - (found.move_s + probe.bias["move"].mean_s)
        return found if self.config.clears(saving, stay) else None

    GatedPolicy.move = move_debiased  # type: ignore[method-assign]


def _wrap_book(probe: Probe) -> None:
    book = Ledger._book

    def book_probe(self: Ledger, endpoint: str, now: float, prefill_s: float,
                   *a: Any, **k: Any) -> None:
        probe.pending.setdefault("booked", {"kind": "?"})["prefill_s"] = prefill_s
        book(self, endpoint, now, prefill_s, *a, **k)

    Ledger._book = book_probe  # type: ignore[method-assign]


def _wrap_kept(probe: Probe) -> None:
    kept = Ledger.kept

    def kept_probe(self: Ledger, *a: Any, **k: Any) -> None:
        probe.pending["booked"] = {"kind": "kept", "prefill_s": 0.0}
        kept(self, *a, **k)

    Ledger.kept = kept_probe  # type: ignore[method-assign]


def _wrap_placed(probe: Probe) -> None:
    placed = Ledger._placed

    def placed_probe(self: Ledger, pool: str, session: str, view: Any, endpoint: str,
                     previous: str | None, *a: Any, **k: Any) -> None:
        kind = ("new" if previous is None else "same engine" if previous == endpoint
                else "re-placed in its DDR pool")
        probe.pending["booked"] = {"kind": kind, "prefill_s": 0.0}
        placed(self, pool, session, view, endpoint, previous, *a, **k)

    Ledger._placed = placed_probe  # type: ignore[method-assign]


def _q(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _describe(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "mean": statistics.fmean(values) if values else math.nan,
            "p10": _q(values, 10), "p50": _q(values, 50), "p90": _q(values, 90),
            "sd": statistics.pstdev(values) if len(values) > 1 else math.nan}


Row = tuple[dict[str, Any], tuple[Any, ...]]  # the gate's figures, the turn's real ones
BACKLOG_BINS = (0.0, 1e-9, 0.5, 1.0, 2.0, 5.0, math.inf)
SAVING_BINS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)


def _side(rows: list[Row], p99: float) -> dict[str, Any]:
    """One side's figures: what the gate predicted, what the turn had, and the error."""
    moved = [d["moved"] for d, _ in rows]
    predicted = [d["best_s"] if m else d["stay_s"] for (d, _), m in zip(rows, moved, strict=True)]
    queue_pred = [d["best_backlog_s"] if m else d["backlog_s"]
                  for (d, _), m in zip(rows, moved, strict=True)]
    real_ttft = [r[4] - r[1] for _, r in rows]
    real_queue = [r[3] - r[2] for _, r in rows]
    return {
        "n": len(rows), "in_tail": sum(1 for t in real_ttft if t >= p99),
        "saving_predicted_s": _describe([d["stay_s"] - d["best_s"] for d, _ in rows]),
        "ttft_error_s": _describe([t - p for t, p in zip(real_ttft, predicted, strict=True)]),
        "queue_error_s": _describe([t - p for t, p in zip(real_queue, queue_pred,
                                                           strict=True)]),
        "slower_than_stay_estimate": (sum(1 for (d, _), t in zip(rows, real_ttft, strict=True)
                                          if t > d["stay_s"]) / len(rows)) if rows else math.nan,
        "read_wait_s": _describe([r[2] - r[1] for _, r in rows]),
        "real_ttft_s": _describe(real_ttft),
        "link_wait_s": _describe([d["link_wait_s"] or 0.0 for d, _ in rows]),
        "read_s": _describe([d["read_s"] for d, _ in rows]),
        "backlog_s": _describe([d["backlog_s"] for d, _ in rows]),
        "best_backlog_s": _describe([d["best_backlog_s"] for d, _ in rows]),
    }


def _binned(rows: list[Row], key: str, edges: tuple[float, ...], p99: float
            ) -> list[dict[str, Any]]:
    """The moves split by one decision-time figure (`key` of the gate's figures, or the
    predicted saving for "saving")."""
    out = []
    for lo, hi in itertools.pairwise(edges):
        part = [(d, r) for d, r in rows
                if lo <= (d["stay_s"] - d["best_s"] if key == "saving" else d[key]) < hi]
        if part:
            side = _side(part, p99)
            out.append({"from": lo, "to": hi, "n": side["n"],
                        "queue_error_s": side["queue_error_s"],
                        "slower_than_stay_estimate": side["slower_than_stay_estimate"]})
    return out


def summary(probe: Probe) -> dict[str, Any]:
    """Per side (moved; stayed with a sibling predicted sooner): the predicted saving, and the
    estimate's error (real less predicted) for the queue and for the TTFT where it went; the
    moves split by the sibling's board backlog and by the predicted saving."""
    real = probe.real
    ttft = sorted(r[4] - r[1] for r in real.values() if r[6])
    p99 = _q(ttft, 99)
    rows = [(d, real[i]) for i, d in probe.decisions.items() if i in real and real[i][6]]
    moves = [(d, r) for d, r in rows if d["moved"]]
    return {
        "requests": len(ttft), "ttft_p99_s": p99,
        "moved": _side(moves, p99),
        "stayed_sooner_elsewhere": _side([(d, r) for d, r in rows if not d["moved"]
                                          and d["best_s"] < d["stay_s"]], p99),
        "moved_by_target_backlog": _binned(moves, "best_backlog_s", BACKLOG_BINS, p99),
        "moved_by_predicted_saving": _binned(moves, "saving", SAVING_BINS, p99),
        "bias_s": {side: mix.mean_s for side, mix in probe.bias.items()},
    }


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: python -m simulator.move_probe OUT.json [--raw] [--debias | "
                         "--debias-below-defaults] -- [kvgate simulate flags...]")
    own, rest = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    out = own[0]
    probe = Probe(debias="--debias" in own or "--debias-below-defaults" in own,
                  below_defaults="--debias-below-defaults" in own)
    _wrap(probe)
    if rest and rest[0] == "simulate":
        rest = rest[1:]
    parser = argparse.ArgumentParser(prog="python -m simulator.move_probe OUT.json --")
    add_arguments(parser)
    code = run(parser.parse_args(rest))
    with open(out, "w") as f:
        json.dump(summary(probe), f, indent=1)
    if "--raw" in own:
        with open(out + ".raw.json", "w") as f:
            json.dump({"decisions": probe.decisions, "real": probe.real,
                       "booked": probe.booked}, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
