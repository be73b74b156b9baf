"""The binding store interface, shared by the etcd and in-memory implementations."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from kvgate.bindings.model import Binding, MoveEstimate
from kvgate.contract.states import MoveReason


class Unbound(Exception):
    """The session gets no binding now: it is routed on Envoy's ring (which needs none) and
    placed again on its next request. `reason`: `pending_full` (etcd is away and the queue of
    bindings waiting for it is full) or `max_bindings` (its pool holds session.max_bindings)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class BindingStore(Protocol):
    """Session → endpoint bindings, answered from memory on the hot path.

    `get`, `touch`, `load` and `count` never do I/O. `create` and `move` are the only writes:
    `create` keeps an existing binding (a concurrent replica's earlier one wins and is returned);
    `move` replaces a binding only if it is still the one the caller saw; either may raise
    `Unbound`. While `synced` is False (still loading, or the watch is lost) a session missing
    from memory may exist elsewhere: `fetch` asks the source (one read) before a new placement.
    While `degraded` is True, writes are queued here and the other replicas cannot see them.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def synced(self) -> bool: ...

    @property
    def degraded(self) -> bool:
        """Writes do not reach the shared store now (they wait in a local queue)."""
        ...

    @property
    def places_on_ring(self) -> bool:
        """New placements go where Envoy's ring puts them, the one placement every replica
        computes alike: while degraded, and for a moment after, while the other replicas'
        queued bindings may not have landed yet."""
        ...

    def get(self, pool: str, session: str) -> Binding | None: ...

    async def fetch(self, pool: str, session: str) -> Binding | None: ...

    def touch(self, binding: Binding) -> None: ...

    def load(self, pool: str) -> Mapping[str, int]: ...

    def count(self, pool: str) -> int: ...

    def bindings(self, pool: str | None = None) -> Iterator[Binding]: ...

    async def create(self, binding: Binding) -> Binding: ...

    async def move(self, current: Binding, endpoint: str,
                   reason: MoveReason | None = None, *, optional: bool = False,
                   estimate: MoveEstimate | None = None) -> Binding:
        """`reason`: why it moves, recorded in the stored binding with the time (and the load
        gate's `estimate`, for its moves). `optional`:
        the session may as well stay (the load gate's move): moved only if the shared store
        takes the write now; else `current` is returned and nothing is queued, since a move
        the other replicas cannot see sends the session's turns to two engines."""
        ...
