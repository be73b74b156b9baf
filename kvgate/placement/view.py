"""A pool as placement sees it: its active endpoints, their KV pools and weights, and rings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvgate.contract.states import EndpointState
from kvgate.placement.ring import EnvoyRing


@dataclass(frozen=True, slots=True)
class Member:
    address: str
    kv_pool: str
    weight: int = 1
    state: EndpointState = EndpointState.ACTIVE


@dataclass(frozen=True, slots=True)
class RingChoice:
    """A ring placement walks, with its hosts and their total weight (cached per view)."""

    ring: EnvoyRing
    hosts: frozenset[str]
    total_weight: int


@dataclass
class PoolView:
    """Immutable in meaning: built once per change of the pool's membership or states."""

    name: str
    members: Sequence[Member]
    _by_address: dict[str, Member] = field(init=False, repr=False)
    _rings: dict[tuple[str | None, str | None], RingChoice] = field(
        init=False, repr=False, default_factory=dict
    )
    _active: list[Member] | None = field(init=False, repr=False, default=None)
    _by_kv: dict[str, tuple[str, ...]] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self._by_address = {m.address: m for m in self.members}

    def state(self, address: str) -> EndpointState | None:
        member = self._by_address.get(address)
        return None if member is None else member.state

    def weight(self, address: str) -> int:
        return self._by_address[address].weight

    def kv_pool_of(self, address: str) -> str | None:
        member = self._by_address.get(address)
        return None if member is None else member.kv_pool

    @property
    def active(self) -> list[Member]:
        if self._active is None:
            self._active = [m for m in self.members if m.state == EndpointState.ACTIVE]
        return self._active

    def ring_for(self, kv_pool: str | None, exclude: str | None) -> RingChoice | None:
        """The ring over active endpoints of `kv_pool` if any besides `exclude` has one, else
        over all active endpoints; None if no endpoint but `exclude` is active.

        `exclude` stays on the ring (callers skip it), also once it has failed or is draining:
        walking the ring it was on finds the successor Envoy's retry was already sent to, so a
        re-bound session stays where its KV cache was just rebuilt."""
        same = self._kv_members().get(kv_pool, ()) if kv_pool is not None else ()
        key = kv_pool if len(same) > 1 or (len(same) == 1 and same[0] != exclude) else None
        gone = self._by_address.get(exclude) if exclude is not None else None
        if gone is not None and (gone.state == EndpointState.ACTIVE
                                 or key not in (None, gone.kv_pool)):
            gone = None  # already on the ring, or not of this ring's KV pool
        ring_key = (key, None if gone is None else gone.address)
        choice = self._rings.get(ring_key)
        if choice is None:
            candidates = [m for m in self.members
                          if (m.state == EndpointState.ACTIVE or m is gone)
                          and (key is None or m.kv_pool == key)]
            choice = self._rings[ring_key] = RingChoice(
                EnvoyRing([(m.address, m.weight) for m in candidates]),
                frozenset(m.address for m in candidates),
                sum(m.weight for m in candidates),
            )
        if not choice.hosts or choice.hosts == {exclude}:
            return None
        return choice

    def _kv_members(self) -> dict[str, tuple[str, ...]]:
        if self._by_kv is None:
            grouped: dict[str, list[str]] = {}
            for m in self.active:
                grouped.setdefault(m.kv_pool, []).append(m.address)
            self._by_kv = {kv: tuple(addresses) for kv, addresses in grouped.items()}
        return self._by_kv
