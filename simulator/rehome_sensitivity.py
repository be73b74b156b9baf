"""How much the load gate's re-homing rule (kvgate.routing.gated `GatedPolicy.rehome`) depends
on its constants: agentic-coding at 960 sessions with HBM residency, each constant halved and
doubled in turn, kvgate's DDR read per request and TTFT p99 beside the constants as they are.

    python -m simulator.rehome_sensitivity [--seed N] [kvgate simulate flags...]
"""

from __future__ import annotations

import argparse
import sys

from benchkit.inputs import engines_and_workload
from kvgate.contract.modes import RoutingMode
from kvgate.placement import evictions
from kvgate.routing import gated
from simulator.command import add_arguments, hashed, router_settings
from simulator.run import simulate
from simulator.setup import SimConfig

# (module, constant): each is read when the rule runs, so setting it here takes effect.
CONSTANTS = ((gated, "REHOME_HELD_BELOW"), (gated, "REHOME_RATE_RATIO"), (evictions, "WINDOW_S"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)  # kvgate simulate's flags
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args([
        "--quiet", "--jobs", "1", "--workload", "agentic-coding", "--sessions", "960",
        "--hbm-residency", "on", *argv])
    options, workload = engines_and_workload(args, check=lambda engines: None)
    config = SimConfig(options, args.load_factor, events=[], progress=False, addresses=[],
                       **router_settings(args))
    blocks = hashed(workload, options.block_size, 1)

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
