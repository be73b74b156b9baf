"""The event loop: requests in arrival order, first tokens and fleet events on a heap.

Each engine is the emulator's ``EngineModel`` (prefix cache, FCFS slots and prefill queue, the
same TTFT formula), the DDR pool the emulator's ``DdrPool``; the engine's schedule is closed form,
so an arrival is admitted at once (the engine looks it up in HBM as of its prefill start and
unpins its blocks at its finish by itself) and its first token and finish are pushed on the heap.
The pool is written as its connector profile says (``emulator.pool_profiles``): the prompt's
blocks at the first token, the answer's (and a profile's end-of-request refresh) at the last, as
in the emulator; a request counts when its last token is out. A request with blocks to read from
the DDR pool first waits for their transfer (the emulator's ``TransferModel``: shared device and
node links, max-min fair, a fixed cost), whose end is an event too; it is then admitted, its TTFT
counted from its arrival (vLLM's asynchronous KV connectors load while the engine prefills other
requests; ``--pool-read-order vllm``, ``simulator.read_order``: read once the engine's
scheduler reaches it, then first in its queue, as vLLM's). The pool can be down or slow for
windows (``PoolFaults``): down, every lookup misses and nothing is stored, and it comes back
empty.
A failed engine loses its HBM and every request it has not finished (they count as errors, and
their sessions ask again after the think time, as a user who saw the error would); a draining
engine keeps its sessions but gets no new ones (kvgate) or leaves the load balancer (Envoy modes).
A router knows the engines only through their scraped metrics (``simulator.observe``), what it
sent and the streams it serves, and a prompt's size as it can estimate it (``simulator.estimate``).

The loop itself, one handler per event kind, is ``simulator.simulation.Simulation``; what it is
given and returns is in ``simulator.setup`` (re-exported here, where callers look for it).
"""

from __future__ import annotations

from kvgate.contract.modes import PdMode, RoutingMode
from kvgate.runtime.tasks.collector import collector_paused
from kvgate.runtime.tasks.loop import run as run_loop
from simulator.setup import (
    LOAD_REFRESH_S,
    POOL_READ_ORDERS,
    PROMPT_ERROR,
    READ_AS_CONNECTOR,
    READ_IN_STEP,
    READ_ON_ARRIVAL,
    READ_WHEN_REACHED,
    FleetEvent,
    SimConfig,
    SimResult,
    check_read_order,
    engine_address,
    read_order_of,
    router_setup,
)
from simulator.simulation import Simulation
from workload.hashing import PromptBlocks
from workload.model import Workload

__all__ = [
    "LOAD_REFRESH_S",
    "POOL_READ_ORDERS",
    "PROMPT_ERROR",
    "READ_AS_CONNECTOR",
    "READ_IN_STEP",
    "READ_ON_ARRIVAL",
    "READ_WHEN_REACHED",
    "FleetEvent",
    "SimConfig",
    "SimResult",
    "check_read_order",
    "engine_address",
    "read_order_of",
    "router_setup",
    "simulate",
    "simulate_async",
]


def simulate(workload: Workload, mode: RoutingMode | PdMode, config: SimConfig,
             blocks: PromptBlocks | None = None) -> SimResult:
    """Run one mode over the whole workload (``blocks``: its prompts, hashed beforehand)."""
    with collector_paused():
        return run_loop(simulate_async(workload, mode, config, blocks))


async def simulate_async(workload: Workload, mode: RoutingMode | PdMode, config: SimConfig,
                         blocks: PromptBlocks | None = None) -> SimResult:
    """``simulate`` inside a running event loop (a router may await, e.g. a real gateway's)."""
    check_read_order(config.pool_read_order, isinstance(mode, PdMode))
    if isinstance(mode, PdMode):
        from simulator.pd_simulation import PdSimulation

        return await PdSimulation(workload, mode, config, blocks).run()
    order = read_order_of(config.pool_read_order, config.engine.pool_profile)
    if order != READ_ON_ARRIVAL and mode.ddr_pool:
        from simulator.read_order import InStepReadOrder, VllmReadOrder

        kind = VllmReadOrder if order == READ_WHEN_REACHED else InStepReadOrder
        return await kind(workload, mode, config, blocks).run()
    return await Simulation(workload, mode, config, blocks).run()
