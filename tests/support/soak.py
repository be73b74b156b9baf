"""What a soak samples: each component's resident memory (from /proc), etcd's database size, and
the bindings etcd holds; each etcd member's own account of its memory, to tell what its resident
set is made of; and the slope of a series, in percent of its mean per hour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def rss_bytes(pid: int | None) -> int:
    """A process's resident set (0 if it is gone)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def etcd_db_bytes(endpoint: str) -> tuple[int, int]:
    """(database file, in use) as one etcd member reports them."""
    async with httpx.AsyncClient() as http:
        reply = await http.post(f"http://{endpoint}/v3/maintenance/status", json={}, timeout=5)
        body = reply.json()
    return int(body.get("dbSize", 0)), int(body.get("dbSizeInUse", 0))


@dataclass(frozen=True)
class EtcdMemory:
    """One member's memory as it reports it. Its resident set is mostly Go's heap still held
    from the OS (`go_retained`: obtained minus released) plus the pages of its database file it
    has touched (bbolt maps the whole file: etcd-io/etcd#18382)."""

    db: int  # this member's database file
    go_obtained: int  # go_memstats_sys_bytes: everything the Go runtime took from the OS
    go_retained: int  # ... less what its scavenger gave back (go_memstats_heap_released_bytes)
    heap_in_use: int  # go_memstats_heap_inuse_bytes: live objects and fragmentation


async def etcd_memory(endpoint: str) -> EtcdMemory:
    """A member's memory figures, from its /metrics and its status."""
    async with httpx.AsyncClient() as http:
        page = (await http.get(f"http://{endpoint}/metrics", timeout=5)).text
    figures = {sample.name: sample.value
               for family in text_string_to_metric_families(page) for sample in family.samples}
    db, _ = await etcd_db_bytes(endpoint)
    obtained = int(figures.get("go_memstats_sys_bytes", 0))
    return EtcdMemory(db, obtained,
                      obtained - int(figures.get("go_memstats_heap_released_bytes", 0)),
                      int(figures.get("go_memstats_heap_inuse_bytes", 0)))


@dataclass(frozen=True)
class Sample:
    at_s: float  # since the soak started
    rss: dict[str, int]  # component -> bytes
    db: int
    db_in_use: int
    bindings: int
    live: int  # sessions used within the bound the bindings should stay under
    etcd: dict[str, EtcdMemory]  # member -> its own account


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), in the value's unit per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def slope_percent_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), as percent of the mean value per hour."""
    mean_v = sum(v for _, v in points) / len(points) if points else 0.0
    return slope_per_hour(points) / mean_v * 100 if mean_v else 0.0
