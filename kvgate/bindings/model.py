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

    @property
    def key(self) -> str:
        """Unique per pool: one session may talk to several pools (say, chat and embeddings)."""
        return binding_key(self.pool, self.session)

    def encode(self) -> bytes:
        return json.dumps({"endpoint": self.endpoint}).encode()

    @classmethod
    def decode(cls, key: str, value: bytes, revision: int) -> Binding:
        pool, _, session = key.partition("/")
        data = json.loads(value)
        return cls(session, pool, str(data["endpoint"]), revision)


def binding_key(pool: str, session: str) -> str:
    return f"{pool}/{session}"
