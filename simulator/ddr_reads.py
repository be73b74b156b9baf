"""Where a simulated mode's DDR reads come from: sessions' first turns, turns that stayed on the
engine of their previous turn (their context reloaded from the pool after that engine's HBM
evicted it), and turns that moved; and how they spread over the engines.

    python -m simulator.ddr_reads MODE [kvgate simulate flags...]
    python -m simulator.ddr_reads affinity+ddr --workload agentic-coding --sessions 960 \\
        --hbm-residency on

Counts the requests `kvgate simulate` measures (after its warm-up), in tokens read from the
pool, as its "DDR read per request" does in bytes.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from kvgate.contract.modes import RoutingMode
from simulator.command import one_simulation
from simulator.run import simulate


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    mode = RoutingMode(argv[0])
    workload, config, blocks = one_simulation(argv[1:], __doc__.split("\n\n")[0])
    result = simulate(workload, mode, config, blocks)

    kinds: dict[str, list[int]] = {"first turn": [0, 0], "stayed": [0, 0], "moved": [0, 0]}
    per_engine: dict[int, int] = defaultdict(int)
    previous: dict[str, int] = {}
    moved: set[str] = set()
    for i, request in enumerate(workload.requests):
        engine = result.assignments[i]
        before = previous.get(request.session)
        kind = "first turn" if before is None else "stayed" if before == engine else "moved"
        if kind == "moved":
            moved.add(request.session)
        if engine >= 0:
            previous[request.session] = engine
        if not workload.measured(request):
            continue
        tokens = result.ddr_tokens[i]
        kinds[kind][0] += 1
        kinds[kind][1] += tokens
        per_engine[engine] += tokens
    total = sum(tokens for _, tokens in kinds.values())
    print(f"{mode}: {total / 1e6:.1f}M tokens read from the DDR pool by the measured requests; "
          f"{len(moved)} of {len(previous)} sessions moved at least once")
    for kind, (turns, tokens) in kinds.items():
        print(f"  {kind:>10}: {tokens / 1e6:6.1f}M tokens over {turns} turns")
    spread = sorted(per_engine.get(e, 0) / 1e6 for e in range(config.engine.instances))
    print("  per engine, fewest first (M tokens): " + ", ".join(f"{t:.1f}" for t in spread))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
