"""The binding store interface, shared by the etcd and in-memory implementations."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from kvgate.bindings.model import Binding


class BindingStore(Protocol):
    """Session → endpoint bindings, answered from memory on the hot path.

    `get`, `touch` and `load` never do I/O. `create` and `move` are the only writes: `create`
    keeps an existing binding (a concurrent replica's earlier one wins and is returned); `move`
    replaces a binding only if it is still the one the caller saw.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def get(self, pool: str, session: str) -> Binding | None: ...

    def touch(self, binding: Binding) -> None: ...

    def load(self, pool: str) -> Mapping[str, int]: ...

    def bindings(self, pool: str | None = None) -> Iterator[Binding]: ...

    async def create(self, binding: Binding) -> Binding: ...

    async def move(self, current: Binding, endpoint: str) -> Binding: ...
