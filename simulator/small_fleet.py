"""The small busy fleet (issue 42): 5 engines saturated by 400 coding-agent sessions over 30
minutes, each growing to 30-80k tokens over one 20k-token prefix every session shares. Each
mode's TTFT p50/p90/p99 per workload seed, and how evenly its engines receive requests: the mean
coefficient of variation of an engine's gaps between arrivals (1 for a random split of the
arrivals, 1/sqrt(5) for round robin's turn-taking over 5 engines).

    python -m simulator.small_fleet [--seeds 0,1,2,3] [--modes M,M] [kvgate simulate flags...]

The same scenario as one `kvgate simulate` command: `SCENARIO` below, e.g.
`kvgate simulate --modes all --seed 0 ` followed by those flags.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from collections.abc import Sequence

from kvgate.contract.modes import RoutingMode
from simulator.command import one_simulation
from simulator.run import SimResult, simulate

SCENARIO = ("--workload", "agentic-coding", "--engines", "5", "--sessions", "400",
            "--duration-s", "1800", "--ramp-s", "450", "--agent-prefix-tokens", "20000",
            "--agent-target-min-tokens", "30000", "--agent-target-max-tokens", "80000")
MODES = ("round_robin+ddr", "affinity+ddr")


def arrival_cv(result: SimResult, engines: int) -> float:
    """The mean, over engines, of the coefficient of variation of the gaps between the requests
    it received (1: Poisson-like; lower: more even)."""
    times: list[list[float]] = [[] for _ in range(engines)]
    for engine, at in zip(result.assignments, result.arrivals, strict=True):
        if engine >= 0:
            times[engine].append(at)
    cvs = []
    for sent in times:
        gaps = [b - a for a, b in itertools.pairwise(sorted(sent))]
        if len(gaps) > 1 and statistics.fmean(gaps) > 0:
            cvs.append(statistics.pstdev(gaps) / statistics.fmean(gaps))
    return statistics.fmean(cvs) if cvs else math.nan


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0", help="workload seeds, comma-separated (0)")
    parser.add_argument("--modes", default=",".join(MODES), help="(%(default)s)")
    args, rest = parser.parse_known_args(argv)
    modes = [RoutingMode(m.strip()) for m in args.modes.split(",") if m.strip()]
    print("| seed | mode | TTFT p50 | TTFT p90 | TTFT p99 | DDR read/request | arrival gap CV |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        workload, config, blocks = one_simulation(
            [*SCENARIO, "--seed", str(seed), *rest], "the small busy fleet")
        for mode in modes:
            result = simulate(workload, mode, config, blocks)
            f = result.stats.figures()
            ddr = f.get("ddr_bytes_per_request_mean")
            print(f"| {seed} | {mode} | {f['ttft_p50_s']:.2f} s | {f['ttft_p90_s']:.2f} s | "
                  f"{f['ttft_p99_s']:.2f} s | "
                  f"{'-' if ddr is None else f'{ddr / 1e9:.2f} GB'} | "
                  f"{arrival_cv(result, config.engine.instances):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
