"""The routing policy from its settings: the one assembly ext_proc, the simulator and bench use."""

from __future__ import annotations

import time
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from kvgate.config.sections.placement import GateConfig
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement.cost import EngineCost
from kvgate.placement.links import host_of
from kvgate.placement.live import LoadBoard
from kvgate.placement.prefix import PrefixHolders
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.policy import STATIC, HbmResidency, Policy, PoolResidency
from kvgate.routing.recent import RecentSessions


def build_policy(
    gate: GateConfig, cost: EngineCost, board: LoadBoard, *,
    clock: Callable[[], float] = time.monotonic, recent: RecentSessions | None = None,
    mix: PrefillMix | None = None, residency: PoolResidency | None = None,
    hbm: HbmResidency | None = None, log: FilteringBoundLogger | None = None,
    node_of: Callable[[str], str] = host_of, prefixes: PrefixHolders | None = None,
    block_tokens: int | None = None,
) -> Policy:
    """The load gate on: the load gate over `board` (on `clock`, its terms
    `gate.terms` priced with `cost`), with what else its caller knows of the fleet: what
    booked requests cost (`mix`, shared with whatever feeds the board), the DDR pool's and
    the engines' residency, each engine's node (`node_of`: whose link from the pool its
    devices share), and where prompts' leading blocks are held, for `gate.prefix_placement`
    (`prefixes` exactly, else an index of what it placed, of `block_tokens`-token blocks);
    off: static stickiness."""
    if gate.feed is None:  # off
        return STATIC
    return GatedPolicy(cost, gate, board, clock=clock, recent=recent, mix=mix,
                       residency=residency, hbm=hbm, log=log, node_of=node_of,
                       prefixes=prefixes, block_tokens=block_tokens)
