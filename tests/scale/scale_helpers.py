"""The cliff at small scale: a client whose largest accepted reply (128 KiB) a few thousand
bindings exceed, as 28,000 exceeded gRPC's default 4 MiB before listings were paged."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from kvgate.bindings.bulk import write_bindings
from kvgate.bindings.etcd import EtcdBindingStore
from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.runtime.tasks.supervisor import Supervisor

SMALL_MESSAGE = 128 * 1024
SMALL_PAGE = 200
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


# How long a test lets a store list its bindings at start: thousands of keys in small pages take
# more than the product's 5 s start budget on a loaded machine (it then serves degraded, still
# listing: test_degraded_mode_and_caps.py); these tests are about what comes after the list.
LISTED_S = 60.0


def small_client(endpoint: str) -> EtcdClient:
    """A client whose pages and messages are small, so that a few hundred keys need several."""
    return EtcdClient([endpoint], page_size=SMALL_PAGE, max_message_bytes=SMALL_MESSAGE)


def sessions(count: int, tag: str = "s") -> list[str]:
    """Canonical UUIDs, as ext_proc keys them."""
    return [f"{tag.encode().hex()[:8]:0>8}-0000-4000-8000-{i:012x}" for i in range(count)]


async def bind(client: EtcdClient, prefix: str, names: list[str],
               lease: int | Callable[[Binding], int] = 0) -> None:
    created = await write_bindings(
        client, prefix,
        (Binding(s, "coder", A if i % 2 else B, hash=i + 1) for i, s in enumerate(names)), lease)
    assert created == len(names)


async def keys_in_etcd(client: EtcdClient, prefix: str) -> set[str]:
    base = f"{prefix}bindings/".encode()
    kvs, _ = await client.get_prefix(base)
    return {kv.key[len(base):].decode() for kv in kvs}


def store_for(client: EtcdClient, prefix: str, registry: CollectorRegistry | None = None,
              idle_ttl: float = 3600) -> EtcdBindingStore:
    return EtcdBindingStore(client, prefix, idle_ttl, write_limit_s=2.0,
                            supervisor=Supervisor("ext_proc", registry or CollectorRegistry()))
