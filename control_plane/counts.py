"""Sessions per endpoint for `kvgate status` and `endpoints list`, in time at any scale.

Up to EXACT_LIMIT bindings they are counted in etcd itself (a paged read, exact and current).
Past it a full read would take seconds, so they come from the freshest ext_proc replica whose
bindings mirror is synced: it holds every binding in memory and reports its counts every few
seconds (kvgate.replicas). etcd counts the total either way (count_only: nothing transferred).
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
    total = await client.count_prefix(scope)
    if total <= EXACT_LIMIT:
        counts: Counter[tuple[str, str]] = Counter()
        async for page, _ in client.pages(scope):
            for kv in page:
                pool_name = kv.key[len(base):].partition(b"/")[0].decode(errors="replace")
                endpoint = endpoint_in(kv.value)
                if endpoint is not None:
                    counts[(pool_name, endpoint)] += 1
        return SessionCounts(counts, total)
    now = clock()
    reports = [r for r in await read_reports(client, prefix)
               if r.synced and now - r.at <= REPORT_TTL]
    if not reports:
        return SessionCounts(Counter(), total, (
            f"{total} bindings in etcd; sessions per endpoint unknown: past {EXACT_LIMIT} they "
            "come from a synced ext_proc replica, and none reports"))
    newest = max(reports, key=lambda r: r.at)
    counts = Counter({(p, e): n for p, loads in newest.loads.items() for e, n in loads.items()
                      if pool is None or p == pool})
    return SessionCounts(counts, total, (
        f"{total} bindings in etcd; sessions per endpoint as ext_proc {newest.identity} "
        f"held them {max(0.0, now - newest.at):.0f}s ago"))
