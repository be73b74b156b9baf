"""Registrations: an engine's own record in etcd, bound to a lease its `kvgate register` keeps
alive. Key `{prefix}registrations/{pool}/{ip:port}`, value JSON `{kv_pool, weight, role}` (each
optional). A lost lease deletes the key: the engine is gone (drained, as any leaving engine)."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from kvgate.config.sections.discover import EtcdSource
from kvgate.contract.states import Role
from kvgate.discovery.reconcile import Found
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent

SOURCE = "etcd"


def registrations_prefix(prefix: str) -> bytes:
    return f"{prefix}registrations/".encode()


def registration_key(prefix: str, pool: str, address: str) -> bytes:
    return registrations_prefix(prefix) + f"{pool}/{address}".encode()


@dataclass(frozen=True, slots=True)
class Registration:
    pool: str
    address: str  # ip:port
    kv_pool: str | None = None
    weight: int | None = None
    role: Role | None = None

    def encode(self) -> bytes:
        data = {"kv_pool": self.kv_pool, "weight": self.weight,
                "role": None if self.role is None else self.role.value}
        return json.dumps({k: v for k, v in data.items() if v is not None}).encode()

    @classmethod
    def decode(cls, pool: str, address: str, value: bytes) -> Registration:
        host, _, port = address.rpartition(":")
        ipaddress.ip_address(host.strip("[]"))  # Envoy uses it verbatim: an IP, not a name
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"port out of range: {port}")
        data = json.loads(value) if value else {}
        if not isinstance(data, dict):
            raise ValueError("a registration is a JSON object")
        weight, role, kv_pool = data.get("weight"), data.get("role"), data.get("kv_pool")
        return cls(pool, address, None if kv_pool is None else str(kv_pool),
                   None if weight is None else max(1, min(128, int(weight))),
                   None if role is None else Role(role))

    def found(self, source: EtcdSource, pool_kv: str) -> Found:
        """As the pool's `etcd:` source gives it: the source's settings, else the
        registration's, else the pool's defaults."""
        return Found(self.address, source.kv_pool or self.kv_pool or pool_kv,
                     source.weight or self.weight or 1,
                     source.role or self.role or Role.BOTH)


class RegistrationTable:
    """A PrefixMirror handler for `registrations/`: pool → address → registration."""

    def __init__(self, prefix: str) -> None:
        self.prefix = registrations_prefix(prefix)
        self.pools: dict[str, dict[str, Registration]] = {}
        self.changes = 0  # bumped on every change (the source's loop looks at it)

    def reset(self, kvs: list[KeyValue]) -> None:
        self.pools = {}
        for kv in kvs:
            self._put(kv)
        self.changes += 1

    def apply(self, event: WatchEvent) -> None:
        parsed = self._parse(event.kv.key)
        if parsed is None:
            return
        if event.deleted:
            self.pools.get(parsed[0], {}).pop(parsed[1], None)
        else:
            self._put(event.kv)
        self.changes += 1

    def _put(self, kv: KeyValue) -> None:
        parsed = self._parse(kv.key)
        if parsed is None:
            return
        pool, address = parsed
        try:
            self.pools.setdefault(pool, {})[address] = Registration.decode(pool, address,
                                                                          kv.value)
        except (ValueError, TypeError):
            return  # unreadable: not an engine

    def _parse(self, key: bytes) -> tuple[str, str] | None:
        if not key.startswith(self.prefix):
            return None
        pool, _, address = key[len(self.prefix):].decode(errors="replace").partition("/")
        return (pool, address) if pool and address else None
