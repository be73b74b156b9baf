"""The compact binding index: what it holds, its relisting in place, and its memory per binding
(at most 250 B, also after a relisting: a million bindings fit in a replica's 350 MB)."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
import uuid
import zlib

from kvgate.bindings.index import TOUCHED, BindingIndex, session_key, session_of
from kvgate.bindings.leases import SHARDS, shard_of
from kvgate.bindings.mirror import BindingMirror
from kvgate.bindings.model import Binding
from kvgate.bindings.pending import PendingWrite, PendingWrites
from kvgate.bindings.store import Unbound
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent

PREFIX = "/kv/"
ENDPOINTS = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(64)]


def kv(pool: str, session: str, endpoint: str, revision: int, lease: int = 0) -> KeyValue:
    return KeyValue(f"{PREFIX}bindings/{pool}/{session}".encode(),
                    Binding(session, pool, endpoint, hash=revision).encode(), revision, lease)


def test_sessions_are_kept_as_ints_and_given_back_as_they_came() -> None:
    canonical = str(uuid.uuid4())
    assert isinstance(session_key(canonical), int) and session_of(session_key(canonical)) == \
        canonical
    for other in ("s1", canonical.upper(), "not-a-uuid-but-36-characters-long!!!", "1_2"):
        assert session_key(other) == other and session_of(other) == other
    index = BindingIndex()
    index.put(Binding(canonical, "p", "10.0.0.1:1", 5), lease=7)
    index.put(Binding("s1", "p", "10.0.0.2:1", 6))
    assert index.find("p", canonical) == Binding(canonical, "p", "10.0.0.1:1", 5)
    assert index.lease(f"p/{canonical}") == 7 and index.lease("p/s1") == 0
    assert sorted(b.session for b in index.bindings("p")) == sorted([canonical, "s1"])
    assert dict(index.load("p")) == {"10.0.0.1:1": 1, "10.0.0.2:1": 1} and len(index) == 2


def test_a_move_keeps_the_touched_flags_and_moves_the_load() -> None:
    index = BindingIndex()
    session = str(uuid.uuid4())
    key = session_key(session)
    index.put(Binding(session, "p", "10.0.0.1:1", 5))
    assert index.touch("p", key, TOUCHED[1])
    index.put(Binding(session, "p", "10.0.0.2:1", 9), lease=3)
    packed = index.packed("p", key)
    assert packed is not None and packed & TOUCHED[1] and not packed & TOUCHED[0]
    assert dict(index.load("p")) == {"10.0.0.2:1": 1}
    assert index.untouch("p", key, TOUCHED[1]) == packed
    assert not index.packed("p", key) & TOUCHED[1]  # type: ignore[operator]
    assert not index.touch("p", session_key(str(uuid.uuid4())), TOUCHED[0])  # not held


def test_a_relisting_drops_only_what_etcd_no_longer_holds() -> None:
    mirror = BindingMirror(PREFIX)
    sessions = [str(uuid.UUID(int=i + 1)) for i in range(6)]
    mirror.reset([kv("p", s, ENDPOINTS[0], 10 + i) for i, s in enumerate(sessions)])
    mirror.index.put(Binding(str(uuid.UUID(int=99)), "p", ENDPOINTS[1], 0))  # queued locally
    # A relisting read at revision 20 that no longer has sessions 0 and 1, while the owner
    # wrote session 5 anew (revision 25) and a listing that stopped half way came before.
    mirror.begin_listing()
    mirror.listed([kv("p", sessions[2], ENDPOINTS[0], 12)])
    mirror.begin_listing()  # the first attempt was lost; the second one goes through
    mirror.listed([kv("p", s, ENDPOINTS[0], 10 + i) for i, s in enumerate(sessions) if i > 2])
    mirror.put(Binding(sessions[5], "p", ENDPOINTS[2], 25), lease=1)
    mirror.listed([kv("p", sessions[2], ENDPOINTS[0], 12)])
    dropped = asyncio.run(mirror.end_listing(20))
    assert dropped == 2
    held = {b.session: b for b in mirror.index.bindings()}
    assert set(held) == {*sessions[2:], str(uuid.UUID(int=99))}
    assert held[sessions[5]].endpoint == ENDPOINTS[2]
    assert mirror.index.load("p")[ENDPOINTS[0]] == 3


def test_watch_events_apply_by_revision() -> None:
    mirror = BindingMirror(PREFIX)
    session = str(uuid.uuid4())
    assert mirror.apply(WatchEvent(False, kv("p", session, ENDPOINTS[0], 5, lease=4)))
    assert not mirror.apply(WatchEvent(False, kv("p", session, ENDPOINTS[1], 4)))
    assert not mirror.apply(WatchEvent(True, KeyValue(kv("p", session, "", 5).key, b"", 5, 0)))
    assert mirror.lease_of(f"p/{session}") == 4
    assert mirror.apply(WatchEvent(True, KeyValue(kv("p", session, "", 6).key, b"", 6, 0)))
    assert len(mirror.index) == 0
    odd = KeyValue(f"{PREFIX}bindings/p/x".encode(), json.dumps(
        {"hash": 1, "endpoint": "10.9.9.9:1"}).encode(), 7, 0)  # another writer's key order
    assert mirror.apply(WatchEvent(False, odd))
    assert mirror.index.find("p", "x") == Binding("x", "p", "10.9.9.9:1", 7)


def _bytes_per_binding(count: int, relist: bool) -> float:
    """Heap growth per binding of a BindingMirror fed `count` bindings as a listing delivers
    them (and listed a second time in place, if `relist`)."""
    kvs = [kv("coder", str(uuid.UUID(int=(i * 2654435761) % 2**128 | 1 << 126)),
              ENDPOINTS[i % len(ENDPOINTS)], 1_000_000 + i, 7587878454045623330 + i % SHARDS)
           for i in range(count)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mirror = BindingMirror(PREFIX)
        for relisting in range(2 if relist else 1):
            mirror.begin_listing()
            for start in range(0, count, 1000):
                mirror.listed(kvs[start:start + 1000])
            asyncio.run(mirror.end_listing(2_000_000 + relisting))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(mirror.index) == count
    return grown / count


def test_memory_per_binding_is_at_most_250_bytes_also_after_a_relisting() -> None:
    first = _bytes_per_binding(60_000, relist=False)
    again = _bytes_per_binding(60_000, relist=True)
    assert first <= 250, first
    assert again <= 250, again


def test_shards_agree_everywhere_and_spread() -> None:
    sessions = [str(uuid.uuid4()) for _ in range(6400)]
    shards = [shard_of(session_key(s)) for s in sessions]
    assert all(0 <= s < SHARDS for s in shards)
    assert min(shards.count(s) for s in range(SHARDS)) > 40  # ~100 each
    assert shard_of("user-42") == zlib.crc32(b"user-42") & 0x3F  # not Python's salted hash


def test_the_pending_queue_is_bounded_and_keeps_the_first_expectation() -> None:
    queue = PendingWrites(limit=2)
    first = queue.add(PendingWrite(Binding("a", "p", ENDPOINTS[0]), 0))
    queue.add(PendingWrite(Binding("b", "p", ENDPOINTS[0]), 5))
    moved = queue.add(PendingWrite(Binding("b", "p", ENDPOINTS[1]), 9))  # same key: no room needed
    assert moved.expected_revision == 5 and len(queue) == 2
    try:
        queue.add(PendingWrite(Binding("c", "p", ENDPOINTS[0]), 0))
    except Unbound as full:
        assert full.reason == "pending_full" and "max_pending_bindings: 2" in str(full)
    else:
        raise AssertionError("a full queue took one more")
    queue.written(first, 11)
    assert "p/a" not in queue and len(queue) == 1
    queue.written(PendingWrite(Binding("b", "p", ENDPOINTS[0]), 5), 12)  # an older write of b
    assert queue.oldest(5)[0].expected_revision == 12  # b's newer write now expects it
