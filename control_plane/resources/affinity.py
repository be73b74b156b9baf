"""Which ext_proc replica decides a session: the same one for all its requests while it is
healthy. The ext_proc filter copies where the session was found (its headers, or the body field
or implicit key Envoy's Lua filter set percent-encoded in `x-kvgate-session-key`: any bytes, a
valid metadata value) into the gRPC stream's initial metadata, and the ext_proc cluster hashes
those keys on a ring (clusters.py `ext_proc_cluster`): Envoy's
configuration for ext_proc session affinity (its ext_proc filter docs; the cluster-level hash
policy is envoyproxy/envoy#41928).
"""

from __future__ import annotations

from kvgate.config.model import Session
from kvgate.session import SESSION_KEY_HEADER


def affinity_metadata(session: Session) -> list[tuple[str, str]]:
    """(metadata key, Envoy substitution format) for each place a session can be found."""
    found = [(name, f"%REQ({name})%") for name in session.headers]
    if session.body_fields or session.implicit:
        found.append((SESSION_KEY_HEADER, f"%REQ({SESSION_KEY_HEADER})%"))
    return found


def affinity_keys(session: Session) -> list[str]:
    """The metadata keys the ext_proc cluster hashes."""
    return [key for key, _ in affinity_metadata(session)]
