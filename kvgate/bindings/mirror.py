"""Every binding as etcd holds it, with its lease: the one place a listing and watch events are
applied to an in-memory index. ext_proc's store (kvgate.bindings.etcd) and the control plane's
failover both keep one."""

from __future__ import annotations

import structlog

from kvgate.bindings.index import BindingIndex
from kvgate.bindings.model import Binding
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent

log = structlog.get_logger("kvgate.bindings")


class BindingMirror:
    """Fed by a PrefixMirror (a listing, then every change) and by its owner's own writes (`put`).

    The newest revision wins: an owner's write can overtake the watch, so an older put or delete
    arriving after it changes nothing (a delete event carries the revision of the delete)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}bindings/".encode()
        self.index = BindingIndex()
        self.leases: dict[str, int] = {}

    def key_of(self, etcd_key: bytes) -> str | None:
        """`pool/session` of a key under the prefix; None for a key outside it."""
        if not etcd_key.startswith(self.prefix):
            return None
        return etcd_key[len(self.prefix):].decode(errors="replace")

    def reset(self, kvs: list[KeyValue]) -> None:
        self.index.clear()
        self.leases.clear()
        for kv in kvs:
            self._put_kv(kv)

    def apply(self, event: WatchEvent) -> bool:
        """Applies one watch event; False when it is older than what is held (or not a binding)."""
        if not event.deleted:
            return self._put_kv(event.kv)
        key = self.key_of(event.kv.key)
        current = None if key is None else self.index.get(key)
        if key is None or current is None or current.revision >= event.kv.mod_revision:
            return False
        self.index.remove(key)
        self.leases.pop(key, None)
        return True

    def put(self, binding: Binding, lease: int) -> bool:
        """Keeps `binding` unless a newer revision of it is held."""
        current = self.index.get(binding.key)
        if current is not None and current.revision > binding.revision:
            return False
        self.index.put(binding)
        self.leases[binding.key] = lease
        return True

    def _put_kv(self, kv: KeyValue) -> bool:
        key = self.key_of(kv.key)
        if key is None or "/" not in key:
            return False
        try:
            binding = Binding.decode(key, kv.value, kv.mod_revision)
        except (ValueError, KeyError, TypeError):
            log.warning("binding_unreadable", key=kv.key.decode(errors="replace"))
            return False
        return self.put(binding, kv.lease)
