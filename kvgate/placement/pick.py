"""Placement: filter (active, same KV pool first) → walk the ring → first endpoint under its
load bound. Pure functions: the same code serves ext_proc, the control plane and the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

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
    return next(iter(candidates(view, hash_value, loads, load_factor,
                                prefer_kv_pool=prefer_kv_pool, exclude=exclude)), None)


def candidates(
    view: PoolView,
    hash_value: int,
    loads: Mapping[str, int],
    load_factor: float,
    *,
    prefer_kv_pool: str | None = None,
    exclude: str | None = None,
) -> Iterator[str]:
    """The endpoints :func:`place` may choose, best first by ring order: those under their load
    bound on the KV pool's ring, then on the whole pool's (each endpoint once). `place` takes
    the first; the load gate scores the first few."""
    whole = view.ring_for(None, exclude)
    if whole is None:
        return
    bound = LoadBound(view, whole, loads, load_factor, exclude)
    seen: set[str] = set()
    rings = [whole]
    if prefer_kv_pool is not None:
        same_kv = view.ring_for(prefer_kv_pool, exclude)
        if same_kv is not None and same_kv is not whole:
            rings.insert(0, same_kv)
    for choice in rings:
        for address in choice.ring.walk(hash_value):
            if address != exclude and address not in seen and bound.admits(address):
                seen.add(address)
                yield address


class LoadBound:
    """Bounded loads: an endpoint is full while it holds `load_factor` × its weighted share of
    the pool's sessions (counting one more, the session being placed)."""

    __slots__ = ("_factor", "_loads", "_total_weight", "_view", "sessions")

    def __init__(self, view: PoolView, whole: RingChoice, loads: Mapping[str, int],
                 load_factor: float, exclude: str | None = None, extra: int = 1) -> None:
        total_weight = whole.total_weight
        if exclude is not None and exclude in whole.hosts:
            total_weight -= view.weight(exclude)
        self._view = view
        self._loads = loads
        self._factor = load_factor
        self._total_weight = total_weight
        self.sessions = (loads.total if isinstance(loads, PoolLoad) else sum(loads.values())
                         ) + extra

    def admits(self, address: str) -> bool:
        weight = self._view.weight(address)
        bound = math.ceil(self._factor * self.sessions * weight / self._total_weight)
        return self._loads.get(address, 0) < bound


def fallback_for(view: PoolView, hash_value: int, primary: str) -> str | None:
    """Where a retry should go if `primary` fails: its ring successor, same KV pool first."""
    choice = view.ring_for(view.kv_pool_of(primary), primary)
    if choice is None:
        return None
    return choice.ring.first_other(hash_value, primary)
