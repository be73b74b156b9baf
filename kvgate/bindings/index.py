"""The in-memory index every store keeps: bindings by pool and session, and load per endpoint.

Compact, because ext_proc holds every binding of the fleet (a million is a day at a bank): one
dict per pool maps the session (a canonical UUID as its 128-bit int) to one int packing the
endpoint (an id into an intern table), the etcd revision, the lease and a few flags. About 150 B
per binding all told, against ~525 B for a dict of Binding objects; `Binding` objects are made
only when asked for. A relisting updates in place (the flags include the listing's mark), so
memory does not double while the new copy arrives.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from kvgate.bindings.model import Binding
from kvgate.placement.load import PoolLoad

# The packed value: | lease (64) | endpoint id (20) | listing (8) | touched (2) | revision (48) |
_REV_MASK = (1 << 48) - 1
TOUCHED = (1 << 48, 1 << 49)  # used during an even / an odd epoch
_TOUCHED_BOTH = TOUCHED[0] | TOUCHED[1]
_GEN_SHIFT = 50  # which listing last saw the binding, mod 256
_GEN_MASK = 0xFF << _GEN_SHIFT
_EP_SHIFT = 58
_EP_MASK = (1 << 20) - 1
_LEASE_SHIFT = 78

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_BYTES = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

SessionKey = int | str


def session_key(session: str) -> SessionKey:
    """A canonical UUID as its int (49 B instead of 85 B as a string); anything else as is."""
    if len(session) == 36 and _UUID.fullmatch(session):
        return int(session.replace("-", ""), 16)
    return session


def session_key_of_bytes(raw: bytes) -> SessionKey:
    """session_key() of a session read from an etcd key, without decoding it first."""
    if len(raw) == 36 and _UUID_BYTES.fullmatch(raw):
        return int(raw.replace(b"-", b""), 16)
    return raw.decode(errors="replace")


def session_of(key: SessionKey) -> str:
    if isinstance(key, str):
        return key
    h = f"{key:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def revision_of(packed: int) -> int:
    return packed & _REV_MASK


def lease_of(packed: int) -> int:
    return packed >> _LEASE_SHIFT


class BindingIndex:
    def __init__(self) -> None:
        self._pools: dict[str, dict[SessionKey, int]] = {}
        self._loads: dict[str, PoolLoad] = {}
        self._endpoint_ids: dict[str, int] = {}
        self._endpoints: list[str] = []
        self._count = 0
        self._mark = 0  # the current listing's generation, shifted into place
        self._unfinished = 0  # listings begun since the last one that finished

    def __len__(self) -> int:
        return self._count

    def count(self, pool: str) -> int:
        return len(self._pools.get(pool, ()))

    def pools(self) -> list[str]:
        return [pool for pool, sessions in self._pools.items() if sessions]

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> Binding | None:
        """The binding of `pool/session`."""
        pool, _, session = key.partition("/")
        return self.find(pool, session)

    def find(self, pool: str, session: str) -> Binding | None:
        sessions = self._pools.get(pool)
        if sessions is None:
            return None
        packed = sessions.get(session_key(session))
        return None if packed is None else self._binding(pool, session, packed)

    def packed(self, pool: str, key: SessionKey) -> int | None:
        sessions = self._pools.get(pool)
        return None if sessions is None else sessions.get(key)

    def lease(self, key: str) -> int:
        """The lease of `pool/session` (0: none, or not held)."""
        pool, _, session = key.partition("/")
        packed = self.packed(pool, session_key(session))
        return 0 if packed is None else lease_of(packed)

    def load(self, pool: str) -> Mapping[str, int]:
        return self._loads.get(pool) or PoolLoad()

    def bindings(self, pool: str | None = None) -> Iterator[Binding]:
        for name in [pool] if pool is not None else list(self._pools):
            sessions = self._pools.get(name, {})
            for key in list(sessions):
                packed = sessions.get(key)
                if packed is not None:
                    yield self._binding(name, session_of(key), packed)

    def keys(self, pool: str) -> list[SessionKey]:
        """A snapshot of a pool's session keys (8 B each), for work done in slices."""
        return list(self._pools.get(pool, ()))

    def endpoint_of(self, packed: int) -> str:
        return self._endpoints[(packed >> _EP_SHIFT) & _EP_MASK]

    def _binding(self, pool: str, session: str, packed: int) -> Binding:
        return Binding(session, pool, self.endpoint_of(packed), packed & _REV_MASK)

    # -- writes ----------------------------------------------------------------------------

    def put(self, binding: Binding, lease: int = 0) -> None:
        self.put_key(binding.pool, session_key(binding.session), binding.endpoint,
                     binding.revision, lease)

    def put_key(
        self, pool: str, key: SessionKey, endpoint: str, revision: int, lease: int
    ) -> None:
        """Stores a binding (keeping its touched flags, marked as seen by the current
        listing)."""
        sessions = self._pools.get(pool)
        if sessions is None:
            sessions = self._pools[pool] = {}
            self._loads[pool] = PoolLoad()
        endpoint_id = self._endpoint_ids.get(endpoint)
        if endpoint_id is None:
            endpoint_id = self._intern(endpoint)
        self._put_id(sessions, pool, key, endpoint_id, revision, lease)

    def put_if_newer(
        self, pool: str, key: SessionKey, endpoint_id: int, revision: int, lease: int
    ) -> bool:
        """put_key() for an endpoint already interned (`endpoint_id`), unless a newer revision
        of the binding is held: the listing's and the watch's path, a million times at start."""
        sessions = self._pools.get(pool)
        if sessions is None:
            sessions = self._pools[pool] = {}
            self._loads[pool] = PoolLoad()
        else:
            old = sessions.get(key)
            if old is not None and old & _REV_MASK > revision:
                return False
        self._put_id(sessions, pool, key, endpoint_id, revision, lease)
        return True

    def endpoint_id(self, endpoint: str) -> int:
        """The intern id of `endpoint` (given one if new)."""
        found = self._endpoint_ids.get(endpoint)
        return self._intern(endpoint) if found is None else found

    def _put_id(
        self, sessions: dict[SessionKey, int], pool: str, key: SessionKey, endpoint_id: int,
        revision: int, lease: int,
    ) -> None:
        old = sessions.get(key)
        if old is None:
            self._count += 1
            self._loads[pool].add(self._endpoints[endpoint_id], 1)
            flags = 0
        else:
            if (old >> _EP_SHIFT) & _EP_MASK != endpoint_id:
                self._loads[pool].add(self.endpoint_of(old), -1)
                self._loads[pool].add(self._endpoints[endpoint_id], 1)
            flags = old & _TOUCHED_BOTH
        sessions[key] = ((lease << _LEASE_SHIFT) | (endpoint_id << _EP_SHIFT) | self._mark
                         | flags | (revision & _REV_MASK))

    def _intern(self, endpoint: str) -> int:
        if len(self._endpoints) > _EP_MASK:
            raise ValueError(f"more than {_EP_MASK + 1} distinct endpoints in bindings")
        self._endpoint_ids[endpoint] = len(self._endpoints)
        self._endpoints.append(endpoint)
        return len(self._endpoints) - 1

    def remove(self, key: str) -> Binding | None:
        pool, _, session = key.partition("/")
        packed = self.discard(pool, session_key(session))
        return None if packed is None else self._binding(pool, session, packed)

    def discard(self, pool: str, key: SessionKey) -> int | None:
        sessions = self._pools.get(pool)
        packed = None if sessions is None else sessions.pop(key, None)
        if packed is not None:
            self._count -= 1
            self._loads[pool].add(self.endpoint_of(packed), -1)
        return packed

    def clear(self) -> None:
        self._pools.clear()
        self._loads.clear()
        self._count = 0

    # -- flags -----------------------------------------------------------------------------

    def touch(self, pool: str, key: SessionKey, flag: int) -> bool:
        """Marks a session as used (`flag`: one of TOUCHED); False if it is not held."""
        sessions = self._pools.get(pool)
        packed = None if sessions is None else sessions.get(key)
        if packed is None:
            return False
        if not packed & flag:
            sessions[key] = packed | flag  # type: ignore[index]
        return True

    def untouch(self, pool: str, key: SessionKey, flag: int) -> int | None:
        """Clears `flag`; the packed value as it was, None if the session is not held."""
        sessions = self._pools.get(pool)
        packed = None if sessions is None else sessions.get(key)
        if packed is not None and packed & flag:
            sessions[key] = packed & ~flag  # type: ignore[index]
        return packed

    # -- relisting in place ----------------------------------------------------------------

    def begin_listing(self) -> None:
        """Everything put from now on carries the new listing's generation. A listing that
        never finished (etcd lost half way) leaves two generations behind; the next one takes
        a third, so neither is mistaken for its own (after 255 unfinished ones in a row the
        index starts afresh rather than wrap around)."""
        self._unfinished += 1
        if self._unfinished >= 255:
            self.clear()
            self._unfinished = 1
        self._mark = (self._mark + (1 << _GEN_SHIFT)) & _GEN_MASK

    def sweep(self, pool: str, key: SessionKey, listed_at: int) -> bool:
        """After a listing read at `listed_at`: drops the binding if the listing did not see it
        yet it is stored at or before that revision (gone from etcd); a local write not yet in
        etcd (revision 0) or a newer one stays, taking the listing's generation. True if
        dropped."""
        sessions = self._pools.get(pool)
        packed = None if sessions is None else sessions.get(key)
        if packed is None or (packed & _GEN_MASK) == self._mark:
            return False
        revision = packed & _REV_MASK
        if 0 < revision <= listed_at:
            self.discard(pool, key)
            return True
        sessions[key] = (packed & ~_GEN_MASK) | self._mark  # type: ignore[index]
        return False

    def end_listing(self) -> None:
        self._unfinished = 0
