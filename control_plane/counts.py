"""Sessions per endpoint for `kvgate status` and `endpoints list`, in time at any scale.

Up to EXACT_LIMIT bindings they are counted in etcd itself (a paged read, exact and current).
Past it a full read would take seconds, so they come from the freshest ext_proc replica whose
bindings mirror is synced: it holds every binding in memory and reports its counts every few
seconds (kvgate.replicas). etcd is asked to count (count_only: nothing transferred, yet it
visits every key: ~1 s at a million here) only when no replica's report says how many there
are.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.bindings.mirror import endpoint_in
from kvgate.etcd import EtcdClient
from kvgate.replicas import REPORT_TTL, read_reports

EXACT_LIMIT = 20_000


@dataclass(frozen=True, slots=True)
class SessionCounts:
    by_endpoint: Counter[tuple[str, str]]  # (pool, endpoint) → sessions
    total: int
    note: str | None = None  # set when not an exact count of etcd's bindings


async def session_counts(
    client: EtcdClient, prefix: str, pool: str | None = None,
    clock: Callable[[], float] = time.time,
) -> SessionCounts:
    base = f"{prefix}bindings/".encode()
    scope = base + (f"{pool}/".encode() if pool else b"")
    now = clock()
    reports = [r for r in await read_reports(client, prefix)
               if r.synced and now - r.at <= REPORT_TTL]
    newest = max(reports, key=lambda r: r.at) if reports else None
    held = None if newest is None else sum(
        n for p, loads in newest.loads.items() if pool is None or p == pool
        for n in loads.values())
    if held is None or held <= EXACT_LIMIT:
        total = await client.count_prefix(scope)  # etcd visits every key: cheap up to here
        if total <= EXACT_LIMIT:
            counts: Counter[tuple[str, str]] = Counter()
            async for page, _ in client.pages(scope):
                for kv in page:
                    pool_name = kv.key[len(base):].partition(b"/")[0].decode(errors="replace")
                    endpoint = endpoint_in(kv.value)
                    if endpoint is not None:
                        counts[(pool_name, endpoint)] += 1
            return SessionCounts(counts, total)
        if newest is None:
            return SessionCounts(Counter(), total, (
                f"{total} bindings in etcd; sessions per endpoint unknown: past {EXACT_LIMIT} "
                "they come from a synced ext_proc replica, and none reports"))
    assert newest is not None and held is not None
    counts = Counter({(p, e): n for p, loads in newest.loads.items() for e, n in loads.items()
                      if pool is None or p == pool})
    return SessionCounts(counts, held, (
        f"{held} bindings; sessions per endpoint as ext_proc {newest.identity} held them "
        f"{max(0.0, now - newest.at):.0f}s ago"))
