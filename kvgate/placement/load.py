"""Sessions per endpoint of a pool, with their running total."""

from __future__ import annotations


class PoolLoad(dict[str, int]):
    """`endpoint → sessions`, plus `total`, kept as bindings come and go, so a first placement
    costs no sum over a thousand endpoints."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def add(self, endpoint: str, delta: int) -> None:
        count = self.get(endpoint, 0) + delta
        self.total += delta
        if count > 0:
            self[endpoint] = count
        else:
            self.pop(endpoint, None)
