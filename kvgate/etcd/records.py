"""What kvgate reads from and writes to etcd, apart from the client that moves it: keys with
their revisions, watch events, transaction guards and writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvgate.etcd.replies import KeyValueMessage


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    deleted: bool
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Guard:
    """A transaction's condition: `key` still has `mod_revision` (0: the key does not exist)."""

    key: bytes
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Fence:
    """A leader's writes hold only while its election key is still on its lease: a leader
    deposed unawares (its lease expired during a pause or a partition, a follower took over)
    has its late writes refused by etcd itself, not by its own idea of who leads."""

    key: bytes
    lease: int


@dataclass(frozen=True, slots=True)
class GuardedPut:
    """One key of a batch (`EtcdClient.put_each`): put `value` with `lease` if the key still has
    `mod_revision` (0: only if absent). `value` None keeps the stored value and changes only the
    lease (etcd's ignore_value)."""

    key: bytes
    value: bytes | None
    lease: int
    mod_revision: int


@dataclass(frozen=True, slots=True)
class PutResult:
    done: bool
    current: KeyValue | None  # after the put when done; else what etcd holds (None: absent)


@dataclass(frozen=True, slots=True)
class Write:
    """A transaction's operation: put `value` at `key`, or delete `key` when value is None."""

    key: bytes
    value: bytes | None


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive range end covering every key that starts with `prefix`."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def key_value(kv: KeyValueMessage) -> KeyValue:
    """A KeyValue from etcd's protobuf message."""
    return KeyValue(kv.key, kv.value, kv.mod_revision, kv.lease)
