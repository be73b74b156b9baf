"""The in-memory index every store keeps: bindings by `pool/session`, and load per endpoint."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping

from kvgate.bindings.model import Binding
from kvgate.placement.load import PoolLoad


class BindingIndex:
    def __init__(self) -> None:
        self._by_key: dict[str, Binding] = {}
        self._load: defaultdict[str, PoolLoad] = defaultdict(PoolLoad)

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: str) -> Binding | None:
        return self._by_key.get(key)

    def put(self, binding: Binding) -> None:
        self.remove(binding.key)
        self._by_key[binding.key] = binding
        self._load[binding.pool].add(binding.endpoint, 1)

    def remove(self, key: str) -> Binding | None:
        old = self._by_key.pop(key, None)
        if old is not None:
            self._load[old.pool].add(old.endpoint, -1)
        return old

    def clear(self) -> None:
        self._by_key.clear()
        self._load.clear()

    def load(self, pool: str) -> Mapping[str, int]:
        return self._load.get(pool) or PoolLoad()

    def bindings(self, pool: str | None = None) -> Iterator[Binding]:
        for binding in list(self._by_key.values()):
            if pool is None or binding.pool == pool:
                yield binding
