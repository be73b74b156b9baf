"""What a soak samples: each component's resident memory (from /proc), etcd's database size, and
the bindings etcd holds; and the slope of a series, in percent of its mean per hour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


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
class Sample:
    at_s: float  # since the soak started
    rss: dict[str, int]  # component -> bytes
    db: int
    db_in_use: int
    bindings: int
    live: int  # sessions used within the bound the bindings should stay under


def slope_percent_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), as percent of the mean value per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0 or mean_v == 0:
        return 0.0
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / spread
    return slope * 3600 / mean_v * 100
