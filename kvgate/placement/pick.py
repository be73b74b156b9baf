"""Placement: filter (active, same KV pool first) → walk the ring → first endpoint under its
load bound. Pure functions: the same code serves ext_proc, the control plane and the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvgate.placement.view import PoolView


def place(
    view: PoolView,
    hash_value: int,
    loads: Mapping[str, int],
    load_factor: float,
    *,
    prefer_kv_pool: str | None = None,
    exclude: str | None = None,
) -> str | None:
    """The endpoint a session should be bound to, or None when the pool has no active endpoint.

    Consistent hashing with bounded loads: an endpoint is skipped while it holds more than
    `load_factor` × its weighted share of the pool's sessions (counting the one being placed).
    """
    ring, members = view.ring_for(prefer_kv_pool, exclude)
    if ring is None:
        return None
    total_weight = sum(view.weight(m) for m in members)
    sessions = sum(loads.get(m, 0) for m in members) + 1
    for address in ring.walk(hash_value):
        bound = math.ceil(load_factor * sessions * view.weight(address) / total_weight)
        if loads.get(address, 0) < bound:
            return address
    return ring.pick(hash_value)  # unreachable with load_factor ≥ 1; kept for safety


def fallback_for(view: PoolView, hash_value: int, primary: str) -> str | None:
    """Where a retry should go if `primary` fails: its ring successor, same KV pool first."""
    ring, _ = view.ring_for(view.kv_pool_of(primary), primary)
    return None if ring is None else ring.pick(hash_value)
