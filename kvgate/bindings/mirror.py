"""Every binding as etcd holds it, with its lease: the one place a listing and watch events are
applied to an in-memory index. ext_proc's store (kvgate.bindings.etcd) keeps one.

A listing arrives in pages (`begin_listing`, `listed` per page, `end_listing`), each applied in
place, so a relisting never holds two copies and never stops the event loop for long; what the
listing did not see is swept afterwards, also in slices.
"""

from __future__ import annotations

import asyncio
import json

import structlog

from kvgate.bindings.index import (
    BindingIndex,
    SessionKey,
    revision_of,
    session_key,
    session_key_of_bytes,
)
from kvgate.bindings.model import Binding
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent

log = structlog.get_logger("kvgate.bindings")

SLICE = 2000  # bindings handled between two yields to the event loop (~2-5 ms)
_ENDPOINT = b'{"endpoint": "'  # how Binding.encode starts: read without a JSON parser


class BindingMirror:
    """Fed by a PrefixMirror (a listing, then every change) and by its owner's own writes (`put`).

    The newest revision wins: an owner's write can overtake the watch, so an older put or delete
    arriving after it changes nothing (a delete event carries the revision of the delete)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}bindings/".encode()
        self.index = BindingIndex()
        self._listing_into_empty = False
        self._pool_names: dict[bytes, str] = {}
        self._endpoint_ids: dict[bytes, int] = {}  # a stored value's endpoint → its intern id

    def key_of(self, etcd_key: bytes) -> str | None:
        """`pool/session` of a key under the prefix; None for a key outside it."""
        if not etcd_key.startswith(self.prefix):
            return None
        return etcd_key[len(self.prefix):].decode(errors="replace")

    def lease_of(self, key: str) -> int:
        return self.index.lease(key)

    # -- listing ---------------------------------------------------------------------------

    def begin_listing(self) -> None:
        self._listing_into_empty = len(self.index) == 0
        self.index.begin_listing()

    def listed(self, kvs: list[KeyValue]) -> None:
        for kv in kvs:
            self._put_kv(kv)

    async def end_listing(self, revision: int) -> int:
        """Drops, in slices, what the listing (read at `revision`) no longer holds; returns how
        many."""
        dropped = 0
        if not self._listing_into_empty:
            for pool in self.index.pools():
                keys = self.index.keys(pool)
                for start in range(0, len(keys), SLICE):
                    for key in keys[start:start + SLICE]:
                        dropped += self.index.sweep(pool, key, revision)
                    await asyncio.sleep(0)
        self.index.end_listing()
        return dropped

    def reset(self, kvs: list[KeyValue]) -> None:
        """A whole listing at once (small prefixes and tests)."""
        self.index.clear()
        self.begin_listing()
        self.listed(kvs)
        self.index.end_listing()

    # -- changes ---------------------------------------------------------------------------

    def apply(self, event: WatchEvent) -> bool:
        """Applies one watch event; False when it is older than what is held (or not a binding)."""
        if not event.deleted:
            return self._put_kv(event.kv)
        parsed = self._parse_key(event.kv.key)
        if parsed is None:
            return False
        pool, key = parsed
        packed = self.index.packed(pool, key)
        if packed is None or revision_of(packed) >= event.kv.mod_revision:
            return False
        self.index.discard(pool, key)
        return True

    def put(self, binding: Binding, lease: int) -> bool:
        """Keeps `binding` unless a newer revision of it is held."""
        key = session_key(binding.session)
        packed = self.index.packed(binding.pool, key)
        if packed is not None and revision_of(packed) > binding.revision:
            return False
        self.index.put_key(binding.pool, key, binding.endpoint, binding.revision, lease)
        return True

    def _parse_key(self, etcd_key: bytes) -> tuple[str, SessionKey] | None:
        if not etcd_key.startswith(self.prefix):
            return None
        rest = etcd_key[len(self.prefix):]
        slash = rest.find(b"/")
        if slash <= 0 or slash == len(rest) - 1:
            return None
        raw_pool = rest[:slash]
        pool = self._pool_names.get(raw_pool)
        if pool is None:
            pool = self._pool_names[raw_pool] = raw_pool.decode(errors="replace")
        return pool, session_key_of_bytes(rest[slash + 1:])

    def _put_kv(self, kv: KeyValue) -> bool:
        parsed = self._parse_key(kv.key)
        if parsed is None:
            return False
        value = kv.value
        endpoint_id = None
        if value.startswith(_ENDPOINT):  # how Binding.encode writes it: no parsing needed
            end = value.find(b'"', len(_ENDPOINT))
            endpoint_id = self._endpoint_ids.get(value[len(_ENDPOINT):end])
        if endpoint_id is None:
            endpoint = endpoint_in(value)
            if endpoint is None:
                log.warning("binding_unreadable", key=kv.key.decode(errors="replace"))
                return False
            endpoint_id = self.index.endpoint_id(endpoint)
            if value.startswith(_ENDPOINT) and len(self._endpoint_ids) < 65536:
                end = value.find(b'"', len(_ENDPOINT))
                if value[len(_ENDPOINT):end] == endpoint.encode():
                    self._endpoint_ids[value[len(_ENDPOINT):end]] = endpoint_id
        pool, key = parsed
        return self.index.put_if_newer(pool, key, endpoint_id, kv.mod_revision, kv.lease)


def endpoint_in(value: bytes) -> str | None:
    """The endpoint of a stored binding: sliced out when written the way Binding.encode writes
    it (a million of them are read at start), else parsed as JSON; None if unreadable."""
    if value.startswith(_ENDPOINT):
        end = value.find(b'"', len(_ENDPOINT))
        if end > len(_ENDPOINT) and b"\\" not in value[len(_ENDPOINT):end]:
            return value[len(_ENDPOINT):end].decode(errors="replace")
    try:
        data = json.loads(value)
        endpoint = data["endpoint"]
    except (ValueError, KeyError, TypeError):
        return None
    return endpoint if isinstance(endpoint, str) and endpoint else None
