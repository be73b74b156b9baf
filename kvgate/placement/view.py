"""A pool as placement sees it: its active endpoints, their KV pools and weights, and rings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvgate.placement.ring import EnvoyRing


@dataclass(frozen=True, slots=True)
class Member:
    address: str
    kv_pool: str
    weight: int = 1
    state: str = "active"  # active | draining | failed


@dataclass
class PoolView:
    """Immutable in meaning: built once per change of the pool's membership or states."""

    name: str
    members: Sequence[Member]
    _by_address: dict[str, Member] = field(init=False, repr=False)
    _rings: dict[tuple[str | None, str | None], tuple[EnvoyRing | None, tuple[str, ...]]] = field(
        init=False, repr=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        self._by_address = {m.address: m for m in self.members}

    def state(self, address: str) -> str | None:
        member = self._by_address.get(address)
        return None if member is None else member.state

    def weight(self, address: str) -> int:
        return self._by_address[address].weight

    def kv_pool_of(self, address: str) -> str | None:
        member = self._by_address.get(address)
        return None if member is None else member.kv_pool

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m.state == "active"]

    def ring_for(
        self, kv_pool: str | None, exclude: str | None
    ) -> tuple[EnvoyRing | None, tuple[str, ...]]:
        """The ring over active endpoints (of `kv_pool` when it has any), without `exclude`."""
        key = (kv_pool, exclude)
        cached = self._rings.get(key)
        if cached is None:
            candidates = [m for m in self.active if m.address != exclude]
            if kv_pool is not None:
                same = [m for m in candidates if m.kv_pool == kv_pool]
                candidates = same or candidates
            hosts = tuple(m.address for m in candidates)
            ring = EnvoyRing([(m.address, m.weight) for m in candidates]) if candidates else None
            cached = self._rings[key] = (ring, hosts)
        return cached
