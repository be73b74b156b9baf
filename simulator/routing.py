"""Each mode's choice of engine, with the gateway's code: Envoy's ring (``EnvoyRing``), and for
kvgate the ext_proc ``Decider`` over an in-memory binding store on the simulation's clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ext_proc.decide import Decider, DecisionError
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.contract.modes import RoutingMode
from kvgate.contract.states import EndpointState
from kvgate.placement import EnvoyRing, session_hash
from kvgate.placement.view import Member, PoolView

POOL = "sim"


class Router(Protocol):
    async def route(self, session: str) -> str | None: ...

    def set_state(self, address: str, state: EndpointState) -> None: ...


class _Members:
    """Endpoint states; the active ones in Envoy's host order."""

    def __init__(self, addresses: Sequence[str], kv_pools: Sequence[str]) -> None:
        self.members = [Member(a, k) for a, k in zip(addresses, kv_pools, strict=True)]

    def set_state(self, address: str, state: EndpointState) -> None:
        self.members = [Member(m.address, m.kv_pool, m.weight, state) if m.address == address
                        else m for m in self.members]

    @property
    def active(self) -> list[str]:
        return [m.address for m in self.members if m.state == EndpointState.ACTIVE]


class RoundRobinRouter:
    """Envoy ROUND_ROBIN over healthy hosts: every request to the next host."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._members = _Members(addresses, ["none"] * len(addresses))
        self._active = self._members.active
        self._next = 0

    async def route(self, session: str) -> str | None:
        if not self._active:
            return None
        address = self._active[self._next % len(self._active)]
        self._next += 1
        return address

    def set_state(self, address: str, state: EndpointState) -> None:
        self._members.set_state(address, state)
        self._active = self._members.active


class RingHashRouter:
    """Envoy RING_HASH on the session header, over healthy hosts."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._members = _Members(addresses, ["none"] * len(addresses))
        self._ring = EnvoyRing([(a, 1) for a in self._members.active])

    async def route(self, session: str) -> str | None:
        return self._ring.pick(session_hash(session.encode()))

    def set_state(self, address: str, state: EndpointState) -> None:
        self._members.set_state(address, state)
        self._ring = EnvoyRing([(a, 1) for a in self._members.active])


class _Directory:
    """What ext_proc's EndpointDirectory offers the Decider: a PoolView per pool."""

    def __init__(self, members: _Members) -> None:
        self._members = members
        self._view = PoolView(POOL, tuple(members.members))

    def view(self, pool: str) -> PoolView:
        return self._view

    def refresh(self) -> None:
        self._view = PoolView(POOL, tuple(self._members.members))


class AffinityRouter:
    """kvgate: sticky bindings, first placement on Envoy's ring with bounded load."""

    def __init__(self, addresses: Sequence[str], kv_pools: Sequence[str],
                 clock: Callable[[], float], load_factor: float, idle_ttl: float) -> None:
        self._members = _Members(addresses, kv_pools)
        self._directory = _Directory(self._members)
        store = MemoryBindingStore(idle_ttl=idle_ttl, clock=clock)
        # _Directory offers what the Decider calls of an EndpointDirectory (view, refresh).
        self._decider = Decider(store, self._directory, load_factor)  # type: ignore[arg-type]

    async def route(self, session: str) -> str | None:
        try:
            decision = await self._decider.decide(POOL, session.encode())
        except DecisionError:
            return None
        return decision.endpoints[0] if decision.endpoints else None

    def set_state(self, address: str, state: EndpointState) -> None:
        self._members.set_state(address, state)
        self._directory.refresh()


def make_router(mode: RoutingMode, addresses: Sequence[str], clock: Callable[[], float],
                load_factor: float, idle_ttl: float) -> Router:
    if mode.round_robin:
        return RoundRobinRouter(addresses)
    if mode is RoutingMode.RING_HASH:
        return RingHashRouter(addresses)
    # As `kvgate up` describes an emulated fleet: one shared DDR pool, or one HBM each.
    kv_pools = (["ddr-pool"] * len(addresses) if mode.ddr_pool
                else [f"hbm-{i}" for i in range(len(addresses))])
    return AffinityRouter(addresses, kv_pools, clock, load_factor, idle_ttl)
