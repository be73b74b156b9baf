"""What the engines' eviction rates add to fleet state (the load gate's re-homing,
kvgate.routing.gated `GatedPolicy.rehome`), per engine per round, projected to a fleet:

- the collector samples each engine's count of evicted blocks every round and gives its rate
  (kvgate.placement.evictions.EvictionRate, as kvgate.fleet.collector does);
- the round's message carries one more column (`EngineLoads.eviction_rate`), built once,
  serialized per stream;
- each replica parses it and keeps the rates (kvgate.fleet.hbm_board.HbmBoard.apply).

Measured in the same run against the same round without the column (the baseline), since this
machine is shared: the figure that matters is the difference, per engine per round.

    python bench/eviction_rate_cost.py [--engines 1000] [--rounds 200] [--replicas 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.placement.evictions import EvictionRate


def _round(endpoints: list[str], rates: list[float] | None) -> pb.FleetLoad:
    n = len(endpoints)
    loads = pb.EngineLoads(endpoint=endpoints, waiting=[1] * n, running=[2] * n,
                           kv_usage=[0.5] * n, age_s=[0.01] * n)
    if rates is not None:
        loads.eviction_rate.extend(rates)
    return pb.FleetLoad(loads=loads)


def measure(engines: int, rounds: int) -> dict[str, float]:
    """CPU seconds per engine per round: the collector's sampling, and a replica's parse and
    keep, with the column and without; bytes per engine either way."""
    endpoints = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000" for i in range(engines)]
    counters = [EvictionRate() for _ in endpoints]
    board = HbmBoard()
    sampling = with_column = without = 0.0
    size = baseline_size = 0
    for r in range(rounds):
        now = r * 0.1
        cpu = time.process_time()
        for i, rate in enumerate(counters):
            rate.sample(now, 40 * r + i % 7)  # ~40 blocks a round, as at full prefill
        rates = [rate.per_s() for rate in counters]
        column = [float("nan") if x is None else x for x in rates]
        sampling += time.process_time() - cpu
        data = _round(endpoints, column).SerializeToString()
        baseline = _round(endpoints, None).SerializeToString()
        cpu = time.process_time()
        board.apply(pb.FleetLoad.FromString(data))
        with_column += time.process_time() - cpu
        cpu = time.process_time()
        board.apply(pb.FleetLoad.FromString(baseline))
        without += time.process_time() - cpu
        size, baseline_size = len(data), len(baseline)
    per = engines * rounds
    return {"collector_cpu_s": sampling / per, "replica_cpu_s": (with_column - without) / per,
            "bytes": (size - baseline_size) / engines}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--refresh-s", type=float, default=0.1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    per = measure(args.engines, args.rounds)
    rounds_per_s = 1 / args.refresh_s
    cores = args.engines * rounds_per_s * (per["collector_cpu_s"]
                                           + args.replicas * per["replica_cpu_s"])
    print(f"per engine per round: the collector's sampling {per['collector_cpu_s'] * 1e6:.2f} "
          f"µs, a replica's keeping {per['replica_cpu_s'] * 1e6:.2f} µs more than without, "
          f"{per['bytes']:.1f} bytes more")
    print(f"{args.engines} engines, {args.replicas} replicas, a round every "
          f"{args.refresh_s:g} s: {cores:.3f} core")
    if args.json is not None:
        args.json.write_text(json.dumps({"per_engine": per, "engines": args.engines,
                                         "replicas": args.replicas, "refresh_s": args.refresh_s,
                                         "cores": cores}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
