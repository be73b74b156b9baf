"""Placement: filter (active, same KV pool first) → walk the ring → first endpoint under its
load bound. Pure functions: the same code serves ext_proc, the control plane and the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvgate.placement.load import PoolLoad
from kvgate.placement.view import PoolView, RingChoice


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

    Consistent hashing with bounded loads: an endpoint is skipped while it holds
    `load_factor` × its weighted share of the pool's sessions (counting the one being placed,
    and those still bound to inactive endpoints: they are about to move too). The bound is the
    whole pool's, also when re-placing: with `prefer_kv_pool` the ring of that KV pool is walked
    first, and the whole pool's ring only once every endpoint of the KV pool is at its bound,
    so a failed engine's sessions fill its DDR-pool siblings evenly and spill over, rather than
    all landing on one sibling.
    """
    whole = view.ring_for(None, exclude)
    if whole is None:
        return None
    total_weight = whole.total_weight
    if exclude is not None and exclude in whole.hosts:
        total_weight -= view.weight(exclude)
    sessions = (loads.total if isinstance(loads, PoolLoad) else sum(loads.values())) + 1

    def first_under_bound(choice: RingChoice) -> str | None:
        for address in choice.ring.walk(hash_value):
            if address == exclude:
                continue
            bound = math.ceil(load_factor * sessions * view.weight(address) / total_weight)
            if loads.get(address, 0) < bound:
                return address
        return None

    if prefer_kv_pool is not None:
        same_kv = view.ring_for(prefer_kv_pool, exclude)
        if same_kv is not None and same_kv is not whole:
            address = first_under_bound(same_kv)
            if address is not None:
                return address
    return first_under_bound(whole)  # None only with load_factor < 1


def fallback_for(view: PoolView, hash_value: int, primary: str) -> str | None:
    """Where a retry should go if `primary` fails: its ring successor, same KV pool first."""
    choice = view.ring_for(view.kv_pool_of(primary), primary)
    if choice is None:
        return None
    return choice.ring.first_other(hash_value, primary)
