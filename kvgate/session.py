"""Session ids: whatever the client sends, as a canonical UUID."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable

from kvgate.generations import Generations

# Fixed forever: changing it would re-key every non-UUID session in every deployment.
SESSION_NAMESPACE = uuid.UUID("8f0e1c52-3a5b-5d2e-9c41-6b7667617465")


def normalize_session(raw: bytes) -> str | None:
    """A valid UUID is kept (canonical, lower case); any other value maps to its UUIDv5.

    Empty or blank → None (sessionless). Works on raw bytes: header values need not be UTF-8.
    """
    value = raw.strip()
    if not value:
        return None
    if 32 <= len(value) <= 45:
        try:
            return str(uuid.UUID(value.decode("ascii")))
        except ValueError:
            pass
    digest = bytearray(hashlib.sha1(SESSION_NAMESPACE.bytes + value).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    return str(uuid.UUID(bytes=bytes(digest)))


class SessionIds:
    """:func:`normalize_session` with a bounded memo: every turn of a conversation sends the same
    header, and a UUIDv5 costs a SHA-1. Two generations (:class:`Generations`), so the sessions
    in use stay memoised however many have come and gone; in ext_proc a generation also ends
    every idle TTL (``max_age_s``). Long values are not kept (memory stays bounded whatever
    clients send)."""

    def __init__(self, capacity: int = 65_536, longest: int = 256,
                 max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._memo: Generations[bytes, str | None] = Generations(capacity, max_age_s, clock)
        self._longest = longest

    def normalize(self, raw: bytes) -> str | None:
        current = self._memo.current
        if raw in current:
            return current[raw]
        session = self._memo.find(raw, _MISSING)
        if session is _MISSING:
            session = normalize_session(raw)
        if len(raw) <= self._longest:
            self._memo.put(raw, session)
        return session


_MISSING = "\0"  # not a value normalize_session returns (a UUID or None)


# Where Envoy hands ext_proc the session it found in the body (dynamic metadata, forwarded):
# one key per configured body field (its dotted path), and the implicit conversation key under
# a name no body field can have. No colon in it: Envoy's %DYNAMIC_METADATA(namespace:key)%,
# which copies it into the ext_proc stream's metadata for the replicas' ring
# (control_plane/resources/affinity.py), splits its argument at colons.
BODY_METADATA_NAMESPACE = "kvgate.session"
IMPLICIT_KEY = "@implicit"
# The implicit key spelled with a colon, still read: during a rolling upgrade, an Envoy whose Lua
# filter came from a control plane before 2026-12-05 writes this spelling.
COLON_IMPLICIT_KEY = ":implicit"
# Never equal to an explicit id a client could send by accident: the implicit key is hashed
# in its own space.
IMPLICIT_PREFIX = b"kvgate-implicit\x00"

# The session key Envoy's Lua filter found in the body (a body field, else the implicit key with
# IMPLICIT_PREFIX), as a request header percent-encoded by `carry_key`: ext_proc decodes it, the
# ext_proc cluster's affinity ring and the route's ring_hash fallback hash it as it is. Removed
# from what clients send, and from what engines receive.
SESSION_KEY_HEADER = "x-kvgate-session-key"
# A key whose encoding is longer than this is not carried: the header says UNCARRIED_KEY instead
# (never an encoding: a `%` not followed by two hex digits), which ext_proc counts.
MAX_CARRIED_KEY = 32 * 1024
UNCARRIED_KEY = "%uncarried"
_KEPT = frozenset(range(0x20, 0x7F)) - {ord("%")}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def carry_key(raw: bytes) -> bytes:
    """What the Lua filter sends for session key `raw`: printable ASCII kept but `%`, every
    other byte `%XX`, and a space at either end too (HTTP/2 forbids them there). Injective, and
    the identity for the usual ids (letters, digits, `-`, `_`, ...), so their ring position is
    the one the same id has in a header."""
    out = "".join(chr(b) if b in _KEPT else f"%{b:02X}" for b in raw)
    if out.startswith(" "):
        out = "%20" + out[1:]
    if out.endswith(" "):
        out = out[:-1] + "%20"
    return out.encode("ascii")


def uncarry_key(wire: bytes) -> bytes | None:
    """The inverse of `carry_key`; None for UNCARRIED_KEY or anything not an encoding."""
    parts = wire.split(b"%")
    out = bytearray(parts[0])
    for part in parts[1:]:
        if len(part) < 2 or part[0] not in _HEX or part[1] not in _HEX:
            return None
        out.append(int(part[:2], 16))
        out += part[2:]
    return bytes(out)
