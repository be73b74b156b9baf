"""The one watch-event applier (kvgate.bindings.mirror): listings, puts and deletes by revision."""

from __future__ import annotations

import json

from kvgate.bindings.mirror import BindingMirror
from kvgate.bindings.model import Binding
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent

PREFIX = "/kv/"


def kv(key: str, endpoint: str, revision: int, lease: int = 7) -> KeyValue:
    value = json.dumps({"endpoint": endpoint}).encode()
    return KeyValue(f"{PREFIX}bindings/{key}".encode(), value, revision, lease)


def put(key: str, endpoint: str, revision: int, lease: int = 7) -> WatchEvent:
    return WatchEvent(False, kv(key, endpoint, revision, lease))


def delete(key: str, revision: int) -> WatchEvent:
    # etcd's delete event: the key, and the revision of the delete as its mod_revision
    return WatchEvent(True, KeyValue(f"{PREFIX}bindings/{key}".encode(), b"", revision, 0))


def endpoint_of(mirror: BindingMirror, key: str) -> str | None:
    binding = mirror.index.get(key)
    return None if binding is None else binding.endpoint


def test_a_listing_keeps_bindings_with_their_leases_and_skips_what_is_not_one() -> None:
    mirror = BindingMirror(PREFIX)
    mirror.reset([
        kv("p/s1", "10.0.0.1:1", 5, lease=11),
        kv("p/s2", "10.0.0.2:1", 6),
        kv("no-pool", "10.0.0.3:1", 7),  # not pool/session
        KeyValue(f"{PREFIX}bindings/p/s3".encode(), b"not json", 8, 0),
        KeyValue(b"/elsewhere/p/s4", json.dumps({"endpoint": "x:1"}).encode(), 9, 0),
    ])
    assert sorted(b.key for b in mirror.index.bindings()) == ["p/s1", "p/s2"]
    assert (mirror.lease_of("p/s1"), mirror.lease_of("p/s2")) == (11, 7)
    assert dict(mirror.index.load("p")) == {"10.0.0.1:1": 1, "10.0.0.2:1": 1}
    mirror.reset([kv("p/s2", "10.0.0.2:1", 6)])  # a relisting replaces everything
    assert [b.key for b in mirror.index.bindings()] == ["p/s2"] and mirror.lease_of("p/s2") == 7


def test_a_newer_put_replaces_an_older_one_is_ignored() -> None:
    mirror = BindingMirror(PREFIX)
    assert mirror.apply(put("p/s", "10.0.0.1:1", 10))
    assert mirror.apply(put("p/s", "10.0.0.2:1", 12, lease=3))
    assert not mirror.apply(put("p/s", "10.0.0.3:1", 11))
    assert endpoint_of(mirror, "p/s") == "10.0.0.2:1" and mirror.lease_of("p/s") == 3
    assert dict(mirror.index.load("p")) == {"10.0.0.2:1": 1}


def test_a_delete_removes_the_binding_it_is_newer_than() -> None:
    mirror = BindingMirror(PREFIX)
    mirror.apply(put("p/s", "10.0.0.1:1", 10))
    assert mirror.apply(delete("p/s", 15))
    assert mirror.index.get("p/s") is None and mirror.lease_of("p/s") == 0
    assert not mirror.apply(delete("p/s", 16))  # nothing left to delete
    assert not mirror.apply(delete("p/unknown", 17))


def test_a_stale_delete_keeps_the_write_that_overtook_it() -> None:
    # The binding expired (deleted at revision 20) and its owner at once wrote a new one
    # (revision 21) and kept it; the watch delivers the delete only afterwards.
    mirror = BindingMirror(PREFIX)
    mirror.apply(put("p/s", "10.0.0.1:1", 10))
    assert mirror.put(Binding("s", "p", "10.0.0.2:1", revision=21), lease=9)
    assert not mirror.apply(delete("p/s", 20))
    assert not mirror.apply(put("p/s", "10.0.0.1:1", 19))
    assert endpoint_of(mirror, "p/s") == "10.0.0.2:1" and mirror.lease_of("p/s") == 9
    assert mirror.apply(put("p/s", "10.0.0.2:1", 21, lease=9))  # the watch catches up: same
    assert mirror.apply(delete("p/s", 30))
    assert mirror.index.get("p/s") is None


def test_events_outside_the_prefix_change_nothing() -> None:
    mirror = BindingMirror(PREFIX)
    other = KeyValue(b"/kv/endpoints/p/10.0.0.1:1", b"{}", 5, 0)
    assert not mirror.apply(WatchEvent(False, other))
    assert not mirror.apply(WatchEvent(True, other))
    assert len(mirror.index) == 0
