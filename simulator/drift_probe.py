"""The load gate's ledger against the engines (issue 42, item 4): for each request the ledger
booked, what it booked (tokens to prefill, tokens to read from the DDR pool, seconds) and what
the simulated engine did (tokens computed, read from DDR, prefill seconds, queue wait), the
difference in computed tokens split by cause:

- `estimate`: the prompt and context sizes from headers against the real counts (the ledger's
  rule with real sizes less what it booked);
- `reuse`: what the engine could reuse that the rule does not count (the answer's blocks a
  kept turn finds, a prefix other sessions left): every leading block of the prompt ever held
  by the engine or the DDR pool, less the rule's context;
- `lost`: of that reusable prefix, what the engine had to compute anyway (evicted from HBM,
  and the pool lost it);

and, apart, `hbm_evicted_read`: tokens read from DDR that the gate took as in HBM (kept turns),
and `overtaken`: the prefill seconds of requests booked after it on its engine that started
first. The rule is the default one (a new session booked whole): with `book_uncached_prefill`
the held prefix it books off shows as a positive `estimate` that `reuse` cancels. OUT.json:
per kind of booking, and each engine's booked less real prefill seconds; OUT.json.raw.json
with `--raw`: every row.

    python -m simulator.drift_probe OUT.json -- --jobs 1 --quiet --modes affinity+ddr \
        --no-oracle [kvgate simulate flags...]

It changes no decision (it wraps the ledger and the simulation; `--jobs 1`, one mode). Three
diagnostics (before `--`) change the run, every mode's alike, and are not rules: `--spread-ticks
S` (trace arrivals spread over S seconds), `--keep-place` (a DDR read the engine's queue hides
keeps its place), `--true-board` (the gate reads each engine's real queue: a ledger with no
drift). docs/journal/small-fleet.md has what they showed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import xxhash

from emulator.ddr_pool import DdrPool
from emulator.prefix_cache import max_hit_blocks
from emulator.timing import Scheduler
from kvgate.placement.live import LoadBoard
from kvgate.routing.booking import Ledger
from simulator.command import add_arguments, run
from simulator.probe_hooks import on_admit, on_place, on_send
from simulator.simulation import Simulation
from workload import trace


@dataclass
class DriftProbe:
    """What the wrappers hear during one run."""

    last_admit: float = 0.0
    pending: dict[str, Any] = field(default_factory=dict)  # the booking of the request routed
    sent: dict[int, dict[str, Any]] = field(default_factory=dict)  # booked + truth at the send
    rows: list[dict[str, Any]] = field(default_factory=list)  # each request, once admitted
    ever: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # per engine
    pooled: set[int] = field(default_factory=set)  # every block the DDR pool was given
    last: dict[str, int] = field(default_factory=dict)  # session -> its last prompt (real)
    booked: int = 0  # requests booked so far (a row's `seq`: the order the ledger heard them)


def _leading(hashes: list[int], limit: int, *held: set[int]) -> int:
    """Leading blocks of `hashes` (at most `limit`) found in any of `held`."""
    n = 0
    for h in hashes[:limit]:
        if not any(h in s for s in held):
            break
        n += 1
    return n


def _wrap_ledger(probe: DriftProbe) -> None:
    book, read = Ledger._book, Ledger._read
    kept, placed, sessionless = Ledger.kept, Ledger._placed, Ledger.sessionless

    def book_probe(self: Ledger, endpoint: str, now: float, prefill_s: float,
                   ready_at: float | None = None) -> None:
        cost = self._cost
        p = probe.pending
        p["backlog_s"] = self._board.backlog_s(endpoint, now)
        p["prefill_s"] = prefill_s
        p["uncached"] = round((prefill_s - cost.prefill_overhead_s) * cost.prefill_tokens_per_s)
        p["ready_s"] = 0.0 if ready_at is None else ready_at - now
        book(self, endpoint, now, prefill_s, ready_at)

    def read_probe(self: Ledger, endpoint: str, now: float, tokens: int) -> float:
        probe.pending["read"] = tokens
        return read(self, endpoint, now, tokens)

    def kept_probe(self: Ledger, pool: str, session: str, endpoint: str, known: Any) -> None:
        probe.pending.update(kind="kept", context=known.size.context_tokens, read=0)
        kept(self, pool, session, endpoint, known)

    def placed_probe(self: Ledger, pool: str, session: str, view: Any, endpoint: str,
                     previous: str | None, known: Any, *a: Any, **k: Any) -> None:
        kind = ("new" if previous is None else "same engine" if previous == endpoint
                else "moved" if view.kv_pool_of(previous) == view.kv_pool_of(endpoint)
                else "other pool")
        probe.pending.update(kind=kind, context=known.size.context_tokens, read=0)
        placed(self, pool, session, view, endpoint, previous, known, *a, **k)

    def sessionless_probe(self: Ledger, endpoint: str, now: float, prompt_tokens: int
                          ) -> None:
        probe.pending.update(kind="sessionless", context=0, read=0)
        sessionless(self, endpoint, now, prompt_tokens)

    Ledger._book = book_probe  # type: ignore[method-assign]
    Ledger._read = read_probe  # type: ignore[method-assign]
    Ledger.kept = kept_probe  # type: ignore[method-assign]
    Ledger._placed = placed_probe  # type: ignore[method-assign]
    Ledger.sessionless = sessionless_probe  # type: ignore[method-assign]


def _wrap_pool(probe: DriftProbe) -> None:
    store, finish = DdrPool.store, DdrPool.finish

    def store_probe(self: DdrPool, prompt: Any, *a: Any, **k: Any) -> Any:
        probe.pooled.update(prompt)
        return store(self, prompt, *a, **k)

    def finish_probe(self: DdrPool, prompt: Any, answer: Any, *a: Any, **k: Any) -> Any:
        if self.profile.store_decode:
            probe.pooled.update(answer)
        return finish(self, prompt, answer, *a, **k)

    DdrPool.store = store_probe  # type: ignore[method-assign]
    DdrPool.finish = finish_probe  # type: ignore[method-assign]


def _wrap_sim(probe: DriftProbe) -> None:
    def sent(sim: Simulation, e: int, i: int) -> None:
        booked, probe.pending = probe.pending, {}
        if "kind" not in booked or "prefill_s" not in booked:
            return  # nothing booked (unknown size)
        request = sim.requests[i]
        n, hashes = sim.blocks.tokens[i], sim.blocks.hashes(i)
        bs, limit = sim.blocks.block_size, max_hit_blocks(n, sim.blocks.block_size)
        probe.booked += 1
        booked.update(
            seq=probe.booked, engine=e, tokens=n, estimate=sim.estimate.tokens(request.session, n),
            previous=probe.last.get(request.session, 0), measured=bool(sim.measured[i]),
            ever_here=_leading(hashes, limit, probe.ever[e]) * bs,
            ever=_leading(hashes, limit, probe.ever[e], probe.pooled) * bs)
        probe.last[request.session] = n
        probe.sent[i] = booked

    def placed(sim: Simulation, e: int, i: int, admission: Any) -> None:
        probe.ever[e].update(admission.hashes)
        row = probe.sent.pop(i, None)
        if row is None:
            return
        s = admission.slot
        row.update(hbm=admission.hbm_hit_tokens, ddr=admission.ddr_hit_tokens,
                   computed=admission.prompt_tokens - admission.cached_tokens,
                   real_prefill_s=s.first_token - s.prefill_start,
                   real_wait_s=s.prefill_start - probe.last_admit,
                   real_read_s=probe.last_admit - s.arrival, t=s.arrival)
        probe.rows.append(row)

    on_send(sent)
    on_place(placed)


def attribution(row: dict[str, Any]) -> dict[str, float]:
    """One request's computed tokens less what the ledger booked, by cause (tokens)."""
    n, kind = row["tokens"], row["kind"]
    context = 0 if kind in ("new", "sessionless") else row["previous"]
    exact = max(0, n - context)  # the ledger's rule with real sizes (nothing held known)
    ideal = max(0, n - max(context, row["ever"]))  # every block ever held still held
    return {"estimate": exact - row["uncached"], "reuse": ideal - exact,
            "lost": row["computed"] - ideal,
            "hbm_evicted_read": row["ddr"] if kind == "kept" else 0}


def _kind(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:  # a mode without the gate books nothing
        return {"n": 0}
    parts: dict[str, float] = defaultdict(float)
    for r in rows:
        for cause, tokens in attribution(r).items():
            parts[cause] += tokens
    booked = sum(r["uncached"] for r in rows)
    computed = sum(r["computed"] for r in rows)
    return {
        "n": len(rows), "booked_uncached": booked, "computed": computed,
        "computed_over_booked": computed / booked if booked else None,
        "causes_tokens": dict(parts),
        "booked_read": sum(r["read"] for r in rows), "real_ddr": sum(r["ddr"] for r in rows),
        "real_hbm": sum(r["hbm"] for r in rows),
        "booked_prefill_s": sum(r["prefill_s"] for r in rows),
        "real_prefill_s": sum(r["real_prefill_s"] for r in rows),
        "booked_read_s_mean": statistics.fmean(r["ready_s"] for r in rows),
        "real_read_s_mean": statistics.fmean(r["real_read_s"] for r in rows),
        "board_backlog_s_mean": statistics.fmean(r["backlog_s"] for r in rows),
        "real_wait_s_mean": statistics.fmean(r["real_wait_s"] for r in rows),
        "overtaken_s_mean": statistics.fmean(r["overtaken_s"] for r in rows),
        "had_read": sum(1 for r in rows if r["real_read_s"] > 0),
    }


def overtaken(rows: list[dict[str, Any]]) -> None:
    """Each row's `overtaken_s`: the real prefill seconds of the requests booked after it on
    its engine that started their prefill before it (the ledger queues them behind it). Only
    requests sent before it was admitted can: one whose DDR read is under way is admitted
    when the read ends, behind what was admitted meanwhile (simulator._on_transfer_loaded)."""
    per_engine: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per_engine[r["engine"]].append(r)
    for booked in per_engine.values():
        booked.sort(key=lambda r: r["seq"])
        for k, r in enumerate(booked):
            admit, start = r["t"] + r["real_read_s"], r["t"] + r["real_read_s"] + r["real_wait_s"]
            seconds = 0.0
            for later in itertools.islice(booked, k + 1, None):
                if later["t"] > admit:
                    break
                if later["t"] + later["real_read_s"] + later["real_wait_s"] < start:
                    seconds += later["real_prefill_s"]
            r["overtaken_s"] = seconds


def summary(probe: DriftProbe) -> dict[str, Any]:
    """Per kind of booking, and per engine (booked less real prefill seconds: the drift)."""
    overtaken(probe.rows)
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    drift: dict[int, float] = defaultdict(float)
    for r in probe.rows:
        by_kind[r["kind"]].append(r)
        drift[r["engine"]] += r["prefill_s"] - r["real_prefill_s"]
    return {"all": _kind(probe.rows),
            "by_kind": {k: _kind(rows) for k, rows in sorted(by_kind.items())},
            "engine_drift_s": dict(sorted(drift.items()))}


def spread_ticks(seconds: float) -> None:
    """A diagnostic of the workload, not of the gate: each trace record arrives at a point of
    the `seconds` after its timestamp fixed by its line (xxHash64), not all of a tick's records
    at the same instant (the Mooncake trace's timestamps are multiples of 3 s)."""
    record = trace._record

    def spread(raw: object, line: int) -> Any:
        r = record(raw, line)
        return r._replace(arrival=r.arrival + seconds * xxhash.xxh64_intdigest(
            str(line).encode()) / 2**64)

    trace._record = spread  # type: ignore[assignment]


def keep_place() -> None:
    """A diagnostic of the engine model, not of the gate: a request whose DDR read the engine's
    queue hides (its prefill would start after the read's estimated end) is admitted when it
    is sent, in its place, as vLLM keeps it (a request waiting for remote KVs is skipped, then
    put back at the head of the waiting queue: vllm/v1/core/sched/scheduler.py, `schedule`);
    the simulator admits it when its read ends, behind what arrived meanwhile. Its transfer
    still runs (the links' traffic), and its end admits nothing."""
    loaded = Simulation._on_transfer_loaded
    early: set[int] = set()

    def send_keeping(self: Simulation, e: int, i: int, ask: Any, hashes: Any,
                     now: float) -> None:
        probe, ddr = self._arrive(e, i, ask, hashes, now)
        engine, transfers = self.fleet.engines[e], self.transfers
        tokens, answer = self._output(e, i)
        if ddr and transfers is not None:
            nbytes = ddr * self.block_bytes
            hidden = (isinstance(engine.scheduler, Scheduler) and engine.scheduler.prefill_start(
                now) >= now + transfers.estimate(now, e, nbytes))
            tid = transfers.start(now, e, nbytes)
            self.loading[tid] = (e, self.fleet.generation[e], probe, i, ddr, now, ask)
            if not hidden:
                return
            early.add(tid)
            self._place(e, i, engine.admit(now, probe, tokens, ddr, answer, arrival=now), ask)
        else:
            self._place(e, i, engine.admit(now, probe, tokens, ddr, answer), ask)

    def loaded_keeping(self: Simulation, tid: int, at: float) -> None:
        if tid in early:
            early.discard(tid)
            del self.loading[tid]
            return
        loaded(self, tid, at)

    Simulation._send = send_keeping  # type: ignore[method-assign]
    Simulation._on_transfer_loaded = loaded_keeping  # type: ignore[method-assign]


def true_board() -> None:
    """A diagnostic bound, not a rule (only the simulator knows it): the load board's backlog
    of an engine is that engine's real FCFS queue at the instant (when a request sent then
    would start its prefill), as a ledger with no drift at all would give; requests whose DDR
    read is under way are not in it yet."""
    init = Simulation.__init__
    sims: list[Simulation] = []

    def init_kept(self: Simulation, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        sims.append(self)

    def backlog_true(self: LoadBoard, address: str, now: float) -> float:
        sim = sims[-1]
        scheduler = sim.fleet.engines[sim.index[address]].scheduler
        return max(0.0, scheduler.prefill_start(now) - now)

    Simulation.__init__ = init_kept  # type: ignore[method-assign]
    LoadBoard.backlog_s = backlog_true  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: python -m simulator.drift_probe OUT.json [--raw] "
                         "[--spread-ticks S] [--keep-place] [--true-board] -- "
                         "[kvgate simulate flags...]")
    own, rest = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    if "--spread-ticks" in own:
        spread_ticks(float(own[own.index("--spread-ticks") + 1]))
    if "--keep-place" in own:  # before the probe's own hooks wrap the send
        keep_place()
    if "--true-board" in own:
        true_board()
    probe = DriftProbe()
    on_admit(probe)
    _wrap_ledger(probe)
    _wrap_pool(probe)
    _wrap_sim(probe)
    parser = argparse.ArgumentParser(prog="python -m simulator.drift_probe OUT.json --")
    add_arguments(parser)
    code = run(parser.parse_args(rest))
    with open(own[0], "w") as f:
        json.dump(summary(probe), f, indent=1)
    if "--raw" in own:
        with open(own[0] + ".raw.json", "w") as f:
            json.dump(probe.rows, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
