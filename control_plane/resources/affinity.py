"""Which ext_proc replica decides a session: the same one for all its requests while it is
healthy. The ext_proc filter copies where the session was found (its headers, the body fields
Envoy read into metadata, the implicit key) into the gRPC stream's initial metadata, and the
ext_proc cluster hashes those keys on a ring (clusters.py `ext_proc_cluster`): Envoy's
configuration for ext_proc session affinity (its ext_proc filter docs; the cluster-level hash
policy is envoyproxy/envoy#41928).
"""

from __future__ import annotations

from kvgate.config.model import Session
from kvgate.session import BODY_METADATA_NAMESPACE, IMPLICIT_KEY


def affinity_metadata(session: Session) -> list[tuple[str, str]]:
    """(metadata key, Envoy substitution format) for each place a session can be found."""
    found = [(name, f"%REQ({name})%") for name in session.headers]
    found += [(f"x-kvgate-body-{i}", f"%DYNAMIC_METADATA({BODY_METADATA_NAMESPACE}:{field})%")
              for i, field in enumerate(session.body_fields)]
    if session.implicit:
        found.append(("x-kvgate-implicit",
                      f"%DYNAMIC_METADATA({BODY_METADATA_NAMESPACE}:{IMPLICIT_KEY})%"))
    return found


def affinity_keys(session: Session) -> list[str]:
    """The metadata keys the ext_proc cluster hashes."""
    return [key for key, _ in affinity_metadata(session)]
