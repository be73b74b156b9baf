"""The etcd replies kvgate reads, typed once here: aetcd's generated stubs (aetcd.rpc) carry no
type information, so each unary call is named with the type of its reply (`EtcdClient._call`
takes an `Rpc`) and each stream's message is read as one of these shapes. Only the fields
kvgate reads are listed (etcd's api/etcdserverpb/rpc.proto has the rest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Header(Protocol):
    revision: int


class KeyValueMessage(Protocol):
    key: bytes
    value: bytes
    mod_revision: int
    lease: int


class RangeReply(Protocol):
    header: Header
    kvs: Sequence[KeyValueMessage]
    more: bool
    count: int


class PutReply(Protocol):
    header: Header


class DeleteRangeReply(Protocol):
    header: Header
    deleted: int


class ResponseOp(Protocol):
    response_range: RangeReply
    response_txn: TxnReply


class TxnReply(Protocol):
    header: Header
    succeeded: bool
    responses: Sequence[ResponseOp]


class LeaseGrantReply(Protocol):
    ID: int


class LeaseKeepAliveReply(Protocol):
    TTL: int


class AlarmMember(Protocol):
    memberID: int
    alarm: int


class AlarmReply(Protocol):
    alarms: Sequence[AlarmMember]


class StatusReply(Protocol):
    dbSize: int
    dbSizeInUse: int


class Event(Protocol):
    type: int
    kv: KeyValueMessage


class WatchReply(Protocol):
    header: Header
    events: Sequence[Event]
    compact_revision: int
    canceled: bool
    cancel_reason: str
    fragment: bool


class AuthenticateReply(Protocol):
    token: str


class Empty(Protocol):
    """A reply kvgate does not read."""


R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Rpc(Generic[R]):
    """A unary etcd call: the stub attribute of `EtcdConnection` it goes through and the
    method's name; `R` is its reply's type."""

    stub: str
    method: str


RANGE: Rpc[RangeReply] = Rpc("_kv", "Range")
PUT: Rpc[PutReply] = Rpc("_kv", "Put")
DELETE_RANGE: Rpc[DeleteRangeReply] = Rpc("_kv", "DeleteRange")
TXN: Rpc[TxnReply] = Rpc("_kv", "Txn")
COMPACT: Rpc[Empty] = Rpc("_kv", "Compact")
LEASE_GRANT: Rpc[LeaseGrantReply] = Rpc("_lease", "LeaseGrant")
LEASE_REVOKE: Rpc[Empty] = Rpc("_lease", "LeaseRevoke")
ALARM: Rpc[AlarmReply] = Rpc("_maintenance", "Alarm")
STATUS: Rpc[StatusReply] = Rpc("_maintenance", "Status")
DEFRAGMENT: Rpc[Empty] = Rpc("_maintenance", "Defragment")
