"""A binding: which endpoint of which pool serves a session."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Binding:
    session: str  # canonical UUID
    pool: str
    endpoint: str  # ip:port
    revision: int = 0  # etcd mod_revision; 0 while not (yet) stored in etcd
    # The session header's ring hash, so whoever re-places the session later (the control
    # plane's failover) walks the same ring ext_proc used for its retry fallback.
    hash: int = 0

    @property
    def key(self) -> str:
        """Unique per pool: one session may talk to several pools (say, chat and embeddings)."""
        return binding_key(self.pool, self.session)

    def encode(self) -> bytes:
        data: dict[str, object] = {"endpoint": self.endpoint}
        if self.hash:
            data["hash"] = self.hash
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, key: str, value: bytes, revision: int) -> Binding:
        pool, _, session = key.partition("/")
        data = json.loads(value)
        return cls(session, pool, str(data["endpoint"]), revision, int(data.get("hash", 0)))


def binding_key(pool: str, session: str) -> str:
    return f"{pool}/{session}"
