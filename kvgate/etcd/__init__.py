"""A small asyncio etcd v3 client (aetcd's generated stubs over grpc.aio) and a prefix mirror."""

from kvgate.etcd.client import EtcdClient, EtcdUnavailable, KeyValue
from kvgate.etcd.mirror import PrefixMirror

__all__ = ["EtcdClient", "EtcdUnavailable", "KeyValue", "PrefixMirror"]
