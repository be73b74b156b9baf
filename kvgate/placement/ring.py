"""Envoy's ring_hash, rebuilt bit for bit, so ext_proc's first placement is where Envoy's
fallback would send the session anyway: an ext_proc outage then moves almost no session.

Mirrors Envoy 1.40's RingHashLoadBalancer with XX_HASH: host keys `"{address}_{i}"`, a ring scaled
so the lightest host gets ceil(min_weight × min_ring_size) entries, lookup = first entry with a
hash ≥ the request hash (wrapping to the start).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

import xxhash

from kvgate.contract.envoy import RING_MAX_SIZE, RING_MIN_SIZE


def session_hash(raw: bytes) -> int:
    """The hash Envoy's `hash_policy: header` computes for a header value (xxHash64, seed 0)."""
    return xxhash.xxh64_intdigest(raw)


class EnvoyRing:
    """An immutable ring over (address, weight) pairs, in the order Envoy sees the hosts."""

    __slots__ = ("_hashes", "_hosts", "_next_other", "size")

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        min_ring_size: int = RING_MIN_SIZE,
        max_ring_size: int = RING_MAX_SIZE,
    ) -> None:
        entries: list[tuple[int, str]] = []
        total = sum(weight for _, weight in hosts)
        if total > 0:
            normalized = [(address, weight / total) for address, weight in hosts]
            min_weight = min(w for _, w in normalized)
            scale = min(math.ceil(min_weight * min_ring_size) / min_weight, float(max_ring_size))
            current = 0.0
            target = 0.0
            for address, weight in normalized:
                target += scale * weight
                i = 0
                while current < target:
                    entries.append((xxhash.xxh64_intdigest(f"{address}_{i}".encode()), address))
                    i += 1
                    current += 1
        entries.sort(key=lambda entry: entry[0])
        self._hashes = [h for h, _ in entries]
        self._hosts = [a for _, a in entries]
        self.size = len(entries)
        self._next_other: list[int] | None = None  # built on first use

    def walk(self, hash_value: int) -> Iterator[str]:
        """Distinct hosts in ring order, starting where Envoy would pick for `hash_value`."""
        if not self._hosts:
            return
        start = bisect.bisect_left(self._hashes, hash_value)
        seen: set[str] = set()
        n = len(self._hosts)
        for step in range(n):
            host = self._hosts[(start + step) % n]
            if host not in seen:
                seen.add(host)
                yield host

    def pick(self, hash_value: int) -> str | None:
        """The host Envoy picks for ``hash_value`` (the first of :meth:`walk`)."""
        if not self._hosts:
            return None
        return self._hosts[bisect.bisect_left(self._hashes, hash_value) % len(self._hosts)]

    def first_other(self, hash_value: int, skip: str) -> str | None:
        """The first host of :meth:`walk` that is not ``skip``, without walking: every request
        asks it (its retry fallback), so it is one lookup."""
        hosts = self._hosts
        if not hosts:
            return None
        i = bisect.bisect_left(self._hashes, hash_value) % len(hosts)
        if hosts[i] != skip:
            return hosts[i]
        if self._next_other is None:
            self._next_other = _next_other(hosts)
        j = self._next_other[i]
        return None if j < 0 else hosts[j]


def _next_other(hosts: list[str]) -> list[int]:
    """Per ring entry, the index of the next entry (wrapping) of another host; -1 if none."""
    n = len(hosts)
    following = [-1] * n
    for k in range(2 * n - 1, -1, -1):  # twice round: the last entries wrap to the first
        i, j = k % n, (k + 1) % n
        following[i] = j if hosts[j] != hosts[i] else following[j]
    return following
