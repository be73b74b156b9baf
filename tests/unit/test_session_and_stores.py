"""Session id normalization, the in-memory store, the health thresholds."""

from __future__ import annotations

import uuid

import pytest

from control_plane.health import HealthTracker
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.bindings.model import Binding
from kvgate.session import SESSION_NAMESPACE, SessionIds, normalize_session


def test_uuid_kept_canonical_other_values_uuid5() -> None:
    raw = "0F8FAD5B-D9CB-469F-A165-70867728950E"
    assert normalize_session(raw.encode()) == raw.lower()
    assert normalize_session(b"urn:uuid:" + raw.encode()) == raw.lower()
    assert normalize_session(b"chat-42") == str(uuid.uuid5(SESSION_NAMESPACE, "chat-42"))
    assert normalize_session(b"") is None and normalize_session(b" \t ") is None
    weird = normalize_session(b"\xff\xfe" * 4096)
    assert weird is not None and uuid.UUID(weird).version == 5
    assert normalize_session(b"not-a-uuid-but-thirty-six-chars-long") != "not-a-uuid"


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The values SessionIds actually hashed (a memo hit computes nothing)."""
    computed: list[bytes] = []

    def counted(raw: bytes) -> str | None:
        computed.append(raw)
        return normalize_session(raw)

    monkeypatch.setattr("kvgate.session.normalize_session", counted)
    return computed


def test_session_ids_memo_answers_like_normalize_and_stays_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ids = SessionIds(capacity=4, longest=64)
    values = [b"chat-%d" % i for i in range(10)] + [b"", b"  ", b"x" * 500, b"chat-3"]
    expected = {raw: normalize_session(raw) for raw in values}
    computed = _counting(monkeypatch)
    for raw in values * 2:
        assert ids.normalize(raw) == expected[raw]
    # Memoised: asked again at once, nothing is computed.
    computed.clear()
    assert ids.normalize(b"chat-3") == expected[b"chat-3"] and computed == []
    # Bounded: two generations of 4 hold at most 8 values, so after 9 others the first is
    # computed again.
    for i in range(9):
        ids.normalize(b"other-%d" % i)
    computed.clear()
    ids.normalize(b"chat-3")
    assert computed == [b"chat-3"]
    # Long values are never kept: each time is computed again.
    computed.clear()
    ids.normalize(b"x" * 500)
    ids.normalize(b"x" * 500)
    assert computed == [b"x" * 500] * 2


def test_session_ids_keep_the_sessions_in_use_however_many_pass_by(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ids = SessionIds(capacity=100)
    computed = _counting(monkeypatch)
    for i in range(1000):  # a busy session between streams of one-off ones
        ids.normalize(b"busy")
        ids.normalize(b"once-%d" % i)
    assert computed.count(b"busy") == 1 and len(computed) == 1001


async def test_memory_store_first_binding_wins_and_move_is_compare_and_set() -> None:
    store = MemoryBindingStore()
    first = await store.create(Binding("s", "p", "10.0.0.1:1"))
    second = await store.create(Binding("s", "p", "10.0.0.2:1"))
    assert second == first
    moved = await store.move(first, "10.0.0.3:1")
    assert moved.endpoint == "10.0.0.3:1"
    stale = await store.move(first, "10.0.0.4:1")  # `first` is no longer current
    assert stale == moved
    assert dict(store.load("p")) == {"10.0.0.3:1": 1}


async def test_memory_store_forgets_idle_bindings() -> None:
    now = [0.0]
    store = MemoryBindingStore(idle_ttl=10, clock=lambda: now[0])
    binding = await store.create(Binding("s", "p", "10.0.0.1:1"))
    now[0] = 8
    store.touch(binding)
    now[0] = 17
    assert store.get("p", "s") == binding
    now[0] = 28
    assert store.get("p", "s") is None
    assert dict(store.load("p")) == {}


def test_health_thresholds() -> None:
    tracker = HealthTracker(unhealthy_threshold=3, healthy_threshold=2)
    assert [tracker.observe(ok) for ok in (False, False, True, False, False)] == [None] * 5
    assert tracker.observe(False) is True
    assert tracker.observe(True) is None
    assert tracker.observe(True) is False


def test_the_session_memo_also_starts_a_generation_every_max_age_on_a_miss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    reads = []

    def clock() -> float:
        reads.append(now[0])
        return now[0]

    ids = SessionIds(capacity=1000, max_age_s=60.0, clock=clock)
    first = ids.normalize(b"a")
    read_before = len(reads)
    assert ids.normalize(b"a") == first and len(reads) == read_before  # a hit reads no clock
    now[0] = 61.0
    ids.normalize(b"b")  # a miss past the age: a new generation, "a" kept in the old one
    now[0] = 122.0
    ids.normalize(b"c")  # and again: "a" is gone from both generations
    computed = _counting(monkeypatch)
    assert ids.normalize(b"a") == first and computed == [b"a"]  # recomputed, the same
