"""The link term's estimate of each DDR read the gate booked against the read's real time in the
simulator's transfer model (issue 42; docs/journal/agentic-peak.md, "the link term's error").

    python -m simulator.link_probe OUT.json -- --jobs 1 --quiet --modes affinity+ddr \
        --no-oracle --gate-terms queue_wait,ddr_read,link_backlog,prefill [flags...]

(`--jobs 1`: the probe wraps this process's classes; it changes no decision.) For every read
the gate books (`LinkBacklog.book`) it records the gate's estimate (booked ready time less the
send), the estimate first come first served would have given (`FifoLinks`, the model before
processor sharing, fed the same bookings), and, once the simulator has started the request's
transfer (`TransferModel.start`, at the same instant), `TransferModel.estimate` then (the fair
share among every transfer in flight, none after) and the transfer's real time, start to
ready. A read is "alone" when no other transfer is in flight on its device at its start;
"gate_saw_clear" when nothing the gate booked was left on its links (`wait_s` 0).
OUT.json: the summary; `--raw` (before `--`) also writes OUT.json.raw.json, every row.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from emulator.transfer import TransferModel
from kvgate.placement.cost import GB, EngineCost
from kvgate.placement.links import LinkBacklog
from simulator.command import add_arguments, run
from simulator.probe_hooks import on_place, on_send, pct
from simulator.simulation import Simulation

WARMUP_S = 360.0  # the committed runs' warm-up: reads sent before it are not summarised
# A booked read: tokens, the gate's estimate, FIFO's, the gate's booked wait on its device
# link before it; then, where a transfer started: real seconds, TransferModel.estimate, bytes,
# others in flight on the device and on the node, of them booked by the gate; the send time.
Row = dict[str, Any]


class FifoLinks:
    """The link term before processor sharing (kvgate.placement.links at 6d3b94b): a read
    waits for every read booked before it on its device link and its node's."""

    def __init__(self, cost: EngineCost, node_of: Any) -> None:
        self.cost, self.node_of = cost, node_of
        self.device: dict[str, float] = {}
        self.node: dict[str, float] = {}

    def book(self, address: str, now: float, tokens: int) -> float:
        """Seconds until the read is ready (last byte plus the fixed cost)."""
        size = tokens * self.cost.kv_bytes_per_token
        device = self.device[address] = (max(self.device.get(address, now), now)
                                          + size / (self.cost.ddr_gbps * GB))
        done = device
        if self.cost.node_gbps:
            node = self.node_of(address)
            end = self.node[node] = (max(self.node.get(node, now), now)
                                     + size / (self.cost.node_gbps * GB))
            done = max(done, end)
        return done + self.cost.transfer_fixed_s - now


@dataclass
class Probe:
    """What the wrappers hear during one run."""

    warmup_s: float = WARMUP_S
    fifo: FifoLinks | None = None
    pending: Row | None = None  # the read booked for the request being routed
    sending: int | None = None  # the request being sent
    rows: dict[int, Row] = field(default_factory=dict)  # by request
    by_transfer: dict[int, tuple[int, float]] = field(default_factory=dict)  # tid -> (i, t0)
    booked_in_flight: set[int] = field(default_factory=set)  # transfers of booked reads
    counts: Counter[str] = field(default_factory=Counter)


def _wrap(probe: Probe) -> None:
    book = LinkBacklog.book

    def book_probe(self: LinkBacklog, address: str, now: float, tokens: int) -> float:
        if probe.fifo is None:
            probe.fifo = FifoLinks(_cost_of(self), self._node_of)
        before = self.wait_s(address, now)
        ready = book(self, address, now, tokens)
        if tokens > 0:
            probe.pending = {"address": address, "t": now, "tokens": tokens,
                             "booked_bytes": tokens * probe.fifo.cost.kv_bytes_per_token,
                             "gate_s": ready - now, "fifo_s": probe.fifo.book(address, now,
                                                                             tokens),
                             "gate_wait_s": before}
        return ready

    LinkBacklog.book = book_probe  # type: ignore[method-assign]

    def record(sim: Simulation, e: int, i: int) -> None:
        probe.sending = i
        pending, probe.pending = probe.pending, None
        if pending is not None and pending["address"] == sim.addresses[e]:
            probe.rows[i] = pending

    def placed(sim: Simulation, e: int, i: int, admission: Any) -> None:
        row = probe.rows.get(i)
        if row is not None:  # what the engine found: HBM, DDR, and what it computes
            row.update(hbm_hit=admission.hbm_hit_tokens, ddr_hit=admission.ddr_hit_tokens,
                       computed=admission.prompt_tokens - admission.cached_tokens)

    on_send(record)
    on_place(placed)
    _wrap_transfers(probe)


def _cost_of(links: LinkBacklog) -> EngineCost:
    """The rates a gate's links were built with."""
    return EngineCost(ddr_gbps=links._device_rate / GB, node_gbps=links._node_rate / GB,
                      kv_bytes_per_token=links._bytes, transfer_fixed_s=links._fixed)


def _wrap_transfers(probe: Probe) -> None:
    start, finish_due = TransferModel.start, TransferModel.finish_due

    def start_probe(self: TransferModel, now: float, device: int, nbytes: float) -> int:
        i, node = probe.sending, self.params.node_of(device)
        row = None if i is None else probe.rows.get(i)
        probe.counts["transfers" if now >= probe.warmup_s else "transfers_warmup"] += 1
        if row is not None:
            on_device = [t for t in self._active.values() if t.device == device]
            on_node = [t for t in self._active.values() if t.node == node]
            row.update(estimate_s=self.estimate(now, device, nbytes), bytes=nbytes,
                       device_others=len(on_device), node_others=len(on_node),
                       device_booked=sum(t.tid in probe.booked_in_flight for t in on_device),
                       node_booked=sum(t.tid in probe.booked_in_flight for t in on_node))
        tid = start(self, now, device, nbytes)
        if row is not None:
            probe.by_transfer[tid] = (i, now)  # type: ignore[assignment]
            probe.booked_in_flight.add(tid)
        return tid

    def finish_probe(self: TransferModel, now: float) -> list[tuple[int, float]]:
        done = finish_due(self, now)
        for tid, ready in done:
            probe.booked_in_flight.discard(tid)
            seen = probe.by_transfer.pop(tid, None)
            if seen is not None:
                probe.rows[seen[0]]["real_s"] = ready - seen[1]
        return done

    TransferModel.start = start_probe  # type: ignore[method-assign]
    TransferModel.finish_due = finish_probe  # type: ignore[method-assign]


def errors(rows: list[Row], key: str) -> dict[str, float]:
    """`key`'s estimate less the real time, in seconds: > 0 over-estimates."""
    error = [r[key] - r["real_s"] for r in rows]
    return {"n": len(error), "mean_s": sum(error) / len(error) if error else 0.0,
            "mean_abs_s": sum(map(abs, error)) / len(error) if error else 0.0,
            "p50_s": pct(error, 50), "p90_s": pct(error, 90), "p99_s": pct(error, 99),
            "p1_s": pct(error, 1), "p10_s": pct(error, 10)}


def summary(probe: Probe, warmup_s: float) -> dict[str, Any]:
    rows = [r for r in probe.rows.values() if r["t"] >= warmup_s]
    read = [r for r in rows if "real_s" in r]
    alone = [r for r in read if r["device_others"] == 0]
    behind = [r for r in read if r["device_others"] > 0]
    out: dict[str, Any] = {
        "booked": len(rows), "with_transfer": len(read),
        "booked_without_transfer": sum(1 for r in rows if "bytes" not in r),
        "booked_tokens": sum(r["tokens"] for r in rows),
        "booked_tokens_without_transfer": sum(r["tokens"] for r in rows if "bytes" not in r),
        # of the reads that never happened, those whose engine computed at least their size
        # (neither tier had it) rather than finding it in HBM
        "without_transfer_computed": sum(1 for r in rows if "bytes" not in r
                                         and r.get("computed", 0) >= r["tokens"]),
        "transfers": probe.counts["transfers"],
        "real_mean_s": sum(r["real_s"] for r in read) / max(1, len(read)),
        "booked_over_read_bytes": sum(r["booked_bytes"] for r in read) / max(
            1.0, sum(r["bytes"] for r in read)),
        "others_on_device_mean": sum(r["device_others"] for r in behind) / max(1, len(behind)),
        "of_them_booked_mean": sum(r["device_booked"] for r in behind) / max(1, len(behind)),
        "others_on_node_mean": sum(r["node_others"] for r in read) / max(1, len(read)),
        "of_them_booked_node_mean": sum(r["node_booked"] for r in read) / max(1, len(read)),
    }
    clear = [r for r in read if r["gate_wait_s"] == 0.0]  # the gate saw nothing booked there
    busy = [r for r in read if r["gate_wait_s"] > 0.0]
    for name, part in (("all", read), ("alone", alone), ("behind", behind),
                       ("gate_saw_clear", clear), ("gate_saw_busy", busy)):
        out[name] = {key: errors(part, key) for key in ("gate_s", "fifo_s", "estimate_s")}
        out[name]["real_mean_s"] = sum(r["real_s"] for r in part) / max(1, len(part))
    return out


def main(argv: list[str]) -> int:
    out, rest = argv[0], argv[argv.index("--") + 1:]
    if rest and rest[0] == "simulate":
        rest = rest[1:]
    probe = Probe()
    if "--duration-s" in rest:
        probe.warmup_s = float(rest[rest.index("--duration-s") + 1]) * 0.1
    _wrap(probe)
    parser = argparse.ArgumentParser(prog="python -m simulator.link_probe OUT.json --")
    add_arguments(parser)
    code = run(parser.parse_args(rest))
    with open(out, "w") as f:
        json.dump(summary(probe, probe.warmup_s), f, indent=1)
    if "--raw" in argv[: argv.index("--")]:
        with open(out + ".raw.json", "w") as f:
            json.dump(probe.rows, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
