"""A binding store that lives in one process: for tests and single-replica use."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from kvgate.bindings.index import BindingIndex
from kvgate.bindings.model import Binding, MoveEstimate, binding_key
from kvgate.contract.states import MoveReason


class MemoryBindingStore:
    """Bindings in a dict; idle ones are forgotten after `idle_ttl` seconds (checked lazily)."""

    def __init__(self, idle_ttl: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        self._index = BindingIndex()
        self._last_used: dict[str, float] = {}
        self._idle_ttl = idle_ttl
        self._clock = clock
        self._revision = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def synced(self) -> bool:
        return True  # memory is the whole truth

    @property
    def degraded(self) -> bool:
        return False  # no other replica shares it

    @property
    def places_on_ring(self) -> bool:
        return False

    async def fetch(self, pool: str, session: str) -> Binding | None:
        return self.get(pool, session)

    def count(self, pool: str) -> int:
        return self._index.count(pool)

    def get(self, pool: str, session: str) -> Binding | None:
        key = binding_key(pool, session)
        binding = self._index.get(key)
        if binding is not None and self._clock() - self._last_used[key] > self._idle_ttl:
            self._index.remove(key)
            del self._last_used[key]
            return None
        return binding

    def touch(self, binding: Binding) -> None:
        if binding.key in self._last_used:
            self._last_used[binding.key] = self._clock()

    def load(self, pool: str) -> Mapping[str, int]:
        return self._index.load(pool)

    def bindings(self, pool: str | None = None) -> Iterator[Binding]:
        return self._index.bindings(pool)

    async def create(self, binding: Binding) -> Binding:
        existing = self.get(binding.pool, binding.session)
        if existing is not None:
            return existing
        return self._store(binding)

    async def move(self, current: Binding, endpoint: str,
                   reason: MoveReason | None = None, *, optional: bool = False,
                   estimate: MoveEstimate | None = None) -> Binding:
        existing = self.get(current.pool, current.session)
        if existing is not None and existing.revision != current.revision:
            return existing
        return self._store(current.moved_to(endpoint, reason, estimate=estimate))

    def _store(self, binding: Binding) -> Binding:
        self._revision += 1
        stored = replace(binding, revision=self._revision)
        self._index.put(stored)
        self._last_used[stored.key] = self._clock()
        return stored
