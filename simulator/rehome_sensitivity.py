"""How much the load gate's re-homing rule (kvgate.routing.moves `rehome`) depends
on its constants: agentic-coding at 960 sessions with HBM residency, each constant halved and
doubled in turn, kvgate's DDR read per request and TTFT p99 beside the constants as they are.

    python -m simulator.rehome_sensitivity [--seed N] [kvgate simulate flags...]
"""

from __future__ import annotations

import sys

from kvgate.contract.modes import RoutingMode
from kvgate.placement import evictions
from kvgate.routing import moves
from simulator.command import one_simulation
from simulator.run import simulate

# (module, constant): each is read when the rule runs, so setting it here takes effect.
CONSTANTS = ((moves, "REHOME_HELD_BELOW"), (moves, "REHOME_RATE_RATIO"), (evictions, "WINDOW_S"))


def main(argv: list[str]) -> int:
    workload, config, blocks = one_simulation(
        ["--workload", "agentic-coding", "--sessions", "960", "--hbm-residency", "on", *argv],
        __doc__.split("\n\n")[0])

    def run(label: str) -> None:
        figures = simulate(workload, RoutingMode.AFFINITY_DDR, config, blocks).stats.figures()
        print(f"{label:>28}: DDR read {figures['ddr_bytes_per_request_mean'] / 1e9:.2f} GB a "
              f"request, TTFT p99 {figures['ttft_p99_s']:.2f} s", flush=True)

    run("as they are")
    for module, name in CONSTANTS:
        value = getattr(module, name)
        for factor in (0.5, 2.0):
            setattr(module, name, value * factor)
            try:
                run(f"{name} {value * factor:g}")
            finally:
                setattr(module, name, value)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
