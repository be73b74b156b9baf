"""A read-only, watch-fed copy of every binding, with its lease: what the control plane's
failover needs to find and move the sessions of a failed or drained endpoint."""

from __future__ import annotations

from kvgate.bindings.index import BindingIndex
from kvgate.bindings.model import Binding
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent


class BindingMirror:
    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}bindings/".encode()
        self.index = BindingIndex()
        self.leases: dict[str, int] = {}

    def reset(self, kvs: list[KeyValue]) -> None:
        self.index.clear()
        self.leases.clear()
        for kv in kvs:
            self._put(kv)

    def apply(self, event: WatchEvent) -> None:
        if event.deleted:
            key = event.kv.key[len(self.prefix):].decode(errors="replace")
            self.index.remove(key)
            self.leases.pop(key, None)
        else:
            self._put(event.kv)

    def _put(self, kv: KeyValue) -> None:
        key = kv.key[len(self.prefix):].decode(errors="replace")
        try:
            binding = Binding.decode(key, kv.value, kv.mod_revision)
        except (ValueError, KeyError, TypeError):
            return
        current = self.index.get(key)
        if current is None or current.revision <= binding.revision:
            self.index.put(binding)
            self.leases[key] = kv.lease
