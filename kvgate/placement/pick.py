"""Placement: filter (active, same KV pool first) → walk the ring → first endpoint under its
load bound. Pure functions: the same code serves ext_proc, the control plane and the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvgate.placement.load import PoolLoad
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
    choice = view.ring_for(prefer_kv_pool, exclude)
    if choice is None:
        return None
    total_weight = choice.total_weight
    if exclude is not None and exclude in choice.hosts:
        total_weight -= view.weight(exclude)
    if isinstance(loads, PoolLoad) and prefer_kv_pool is None and exclude is None:
        # The whole pool: its running total (sessions still on an inactive endpoint count too,
        # which loosens the bound a little while they move).
        sessions = loads.total + 1
    else:
        sessions = sum(loads.get(m, 0) for m in choice.hosts if m != exclude) + 1
    for address in choice.ring.walk(hash_value):
        if address == exclude:
            continue
        bound = math.ceil(load_factor * sessions * view.weight(address) / total_weight)
        if loads.get(address, 0) < bound:
            return address
    return None  # unreachable with load_factor ≥ 1


def fallback_for(view: PoolView, hash_value: int, primary: str) -> str | None:
    """Where a retry should go if `primary` fails: its ring successor, same KV pool first."""
    choice = view.ring_for(view.kv_pool_of(primary), primary)
    if choice is None:
        return None
    return choice.ring.first_other(hash_value, primary)
