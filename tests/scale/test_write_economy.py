"""Write economy: sessions used through three replicas at once are rewritten at most once per
epoch (one set of leases per epoch shared by every replica, re-attachment by compare-and-set),
counted in etcd itself. A real etcd, epochs of one second; the measurement is the scale
benchmark's own (bench/scale/etcd_writes.py)."""

from __future__ import annotations

from bench.scale.etcd_writes import writes_per_epoch


async def test_three_replicas_rewrite_a_used_session_at_most_once_per_epoch(
    etcd, prefix: str
) -> None:
    measured = await writes_per_epoch(etcd.endpoint, prefix, replicas=3, sessions=300,
                                      epochs=5, idle_ttl=4.0)
    assert measured["writes_per_session_per_epoch"] <= 1.1, measured
    assert measured["sessions_rewritten"] == 300  # yet every used session was kept alive
    assert measured["still_held"] == 300  # by every replica: none expired
