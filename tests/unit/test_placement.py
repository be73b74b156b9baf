"""Placement: Envoy's ring rebuilt exactly, bounded loads, KV-pool preference."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from kvgate.placement import EnvoyRing, fallback_for, place, session_hash
from kvgate.placement.view import Member, PoolView


def _view(*members: Member) -> PoolView:
    return PoolView("coder", members)


def test_ring_sizes_follow_envoy_scaling() -> None:
    assert EnvoyRing([("a:1", 1), ("b:1", 1), ("c:1", 1)]).size == 3 * math.ceil(1024 / 3)
    # Weights: the lightest host gets ceil(1024 × 1/4) entries, the heavy one three times that.
    assert EnvoyRing([("a:1", 1), ("b:1", 3)]).size == 1024
    assert EnvoyRing([]).size == 0 and EnvoyRing([]).pick(5) is None


def test_ring_walk_yields_each_host_once_starting_at_the_pick() -> None:
    ring = EnvoyRing([(f"10.0.0.{i}:8000", 1) for i in range(5)])
    for key in (b"a", b"b", b"c"):
        walk = list(ring.walk(session_hash(key)))
        assert sorted(walk) == sorted(f"10.0.0.{i}:8000" for i in range(5))
        assert walk[0] == ring.pick(session_hash(key))


@pytest.mark.parametrize("hosts", [[("a:1", 1)], [("a:1", 1), ("b:1", 3)],
                                   [(f"10.0.0.{i}:8000", 1 + i % 3) for i in range(7)]])
def test_first_other_is_the_walks_first_host_but_the_one_skipped(
        hosts: list[tuple[str, int]]) -> None:
    ring = EnvoyRing(hosts)
    for key in range(300):
        value = session_hash(str(key).encode())
        walk = list(ring.walk(value))
        for skip in [walk[0], walk[-1], "absent:1"]:
            assert ring.first_other(value, skip) == next((a for a in walk if a != skip), None)
    assert ring.first_other(2**64 - 1, "a:1") == next((a for a in ring.walk(2**64 - 1)
                                                       if a != "a:1"), None)  # wraps


def test_bounded_load_caps_every_endpoint() -> None:
    view = _view(*(Member(f"10.0.0.{i}:8000", "kv") for i in range(4)))
    loads: Counter[str] = Counter()
    for n in range(200):
        chosen = place(view, session_hash(f"s{n}".encode()), loads, 1.25)
        assert chosen is not None
        loads[chosen] += 1
    assert max(loads.values()) <= math.ceil(1.25 * 200 / 4)


def test_without_pressure_placement_is_envoys_ring_pick() -> None:
    view = _view(*(Member(f"10.0.0.{i}:8000", "kv") for i in range(4)))
    ring = EnvoyRing([(m.address, 1) for m in view.members])
    for n in range(50):
        h = session_hash(f"s{n}".encode())
        assert place(view, h, {}, 1.25) == ring.pick(h)


def test_weights_share_sessions_proportionally() -> None:
    view = _view(Member("10.0.0.1:1", "kv", 1), Member("10.0.0.2:1", "kv", 3))
    loads: Counter[str] = Counter()
    for n in range(400):
        chosen = place(view, session_hash(f"w{n}".encode()), loads, 1.1)
        assert chosen is not None
        loads[chosen] += 1
    assert loads["10.0.0.2:1"] == pytest.approx(300, abs=35)


def test_replacement_prefers_same_kv_pool_and_skips_inactive() -> None:
    view = _view(
        Member("10.0.0.1:1", "kv-a", state="failed"),
        Member("10.0.0.2:1", "kv-a"),
        Member("10.0.0.3:1", "kv-b"),
        Member("10.0.0.4:1", "kv-b"),
        Member("10.0.0.5:1", "kv-a", state="draining"),
    )
    for n in range(30):
        h = session_hash(f"r{n}".encode())
        assert place(view, h, {}, 1.25, prefer_kv_pool="kv-a", exclude="10.0.0.1:1") == "10.0.0.2:1"
        assert place(view, h, {}, 1.25) in {"10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"}
        assert fallback_for(view, h, "10.0.0.3:1") == "10.0.0.4:1"
        assert fallback_for(view, h, "10.0.0.2:1") in {"10.0.0.3:1", "10.0.0.4:1"}


@pytest.mark.parametrize("kv_pools", [["own-1", "own-2", "own-3", "own-4"], ["ddr"] * 4])
@pytest.mark.parametrize("gone_as", ["failed", "draining"])
def test_rebind_lands_where_the_retry_fallback_went(kv_pools: list[str], gone_as: str) -> None:
    addresses = [f"10.0.1.{i}:8000" for i in range(1, 5)]
    before = _view(*(Member(a, k) for a, k in zip(addresses, kv_pools, strict=True)))
    victim = addresses[1]
    after = _view(*(Member(a, k, state=gone_as if a == victim else "active")
                    for a, k in zip(addresses, kv_pools, strict=True)))
    hashes = [session_hash(f"s{n}".encode()) for n in range(400)]
    orphans = [h for h in hashes if before.ring_for(None, None).ring.pick(h) == victim]
    assert len(orphans) > 40
    for h in orphans:
        retried_to = fallback_for(before, h, victim)  # Envoy's retry, while the victim was up
        rebound = place(after, h, {}, 1.25, prefer_kv_pool=before.kv_pool_of(victim),
                        exclude=victim)
        assert rebound == retried_to != victim
        assert fallback_for(after, h, victim) == retried_to  # also while it drains


def _rebind_all(view: PoolView, loads: Counter[str], victim: str, count: int) -> Counter[str]:
    """Re-places `count` sessions of `victim` one by one, as the failover does."""
    moved: Counter[str] = Counter()
    for n in range(count):
        target = place(view, session_hash(f"o{n}".encode()), loads, 1.25,
                       prefer_kv_pool=view.kv_pool_of(victim), exclude=victim)
        assert target is not None and target != victim
        loads[target] += 1
        loads[victim] -= 1
        moved[target] += 1
    return moved


def test_rebinding_fills_the_kv_pool_siblings_to_the_bound_then_spills() -> None:
    a1, a2, b1, b2 = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"
    view = _view(Member(a1, "kv-a", state="failed"), Member(a2, "kv-a"),
                 Member(b1, "kv-b"), Member(b2, "kv-b"))
    loads = Counter({a1: 374, a2: 331, b1: 350, b2: 340})
    bound = math.ceil(1.25 * (sum(loads.values()) + 1) / 3)
    moved = _rebind_all(view, loads, a1, 374)
    assert loads[a1] == 0 and max(loads.values()) <= bound
    assert moved[a2] == bound - 331  # the DDR-pool sibling first, up to its bound
    assert moved[b1] + moved[b2] == 374 - moved[a2]  # only the rest spilled


def test_rebinding_stays_in_the_kv_pool_while_it_has_room() -> None:
    a1, a2, a3, b1 = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"
    view = _view(Member(a1, "kv-a", state="failed"), Member(a2, "kv-a"),
                 Member(a3, "kv-a"), Member(b1, "kv-b"))
    loads = Counter({a1: 100, a2: 100, a3: 100, b1: 100})
    moved = _rebind_all(view, loads, a1, 100)
    assert moved[b1] == 0 and moved[a2] + moved[a3] == 100
    assert max(moved.values()) <= 60, moved  # both siblings, not one


def test_no_active_endpoint_places_nowhere() -> None:
    view = _view(Member("10.0.0.1:1", "kv", state="failed"))
    assert place(view, 1, {}, 1.25) is None
    assert fallback_for(view, 1, "10.0.0.1:1") is None
