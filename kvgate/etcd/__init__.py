"""A small asyncio etcd v3 client (aetcd's generated stubs over grpc.aio) and a prefix mirror."""

from kvgate.etcd.client import EtcdClient, KeyValue
from kvgate.etcd.errors import (
    EtcdAuthError,
    EtcdError,
    EtcdErrorKind,
    EtcdNoSpace,
    EtcdTooLarge,
    EtcdUnavailable,
)
from kvgate.etcd.mirror import PrefixMirror

__all__ = [
    "EtcdAuthError", "EtcdClient", "EtcdError", "EtcdErrorKind", "EtcdNoSpace", "EtcdTooLarge",
    "EtcdUnavailable", "KeyValue", "PrefixMirror",
]
