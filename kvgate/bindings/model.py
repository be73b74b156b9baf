"""A binding: which endpoint of which pool serves a session."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from kvgate.contract.states import MoveReason


@dataclass(frozen=True, slots=True)
class Binding:
    session: str  # canonical UUID
    pool: str
    endpoint: str  # ip:port
    revision: int = 0  # etcd mod_revision; 0 while not (yet) stored in etcd
    # The session header's ring hash, so whoever re-places the session later (the control
    # plane's failover) walks the same ring ext_proc used for its retry fallback.
    hash: int = 0
    # Its last move (unix time, and why): what `kvgate sessions show` reports. Stored in etcd
    # only, not in ext_proc's compact index: a binding read from memory says 0 / None.
    moved_at: float = 0.0
    move_reason: MoveReason | None = None

    @property
    def key(self) -> str:
        """Unique per pool: one session may talk to several pools (say, chat and embeddings)."""
        return binding_key(self.pool, self.session)

    def encode(self) -> bytes:
        data: dict[str, object] = {"endpoint": self.endpoint}
        if self.hash:
            data["hash"] = self.hash
        if self.move_reason is not None:
            data["moved_at"] = round(self.moved_at, 3)
            data["reason"] = str(self.move_reason)
        return json.dumps(data).encode()

    def moved_to(self, endpoint: str, reason: MoveReason | None,
                 at: float | None = None) -> Binding:
        """This binding moved to `endpoint` (now, unless `at`), for `reason` (None: keeps its
        previous move's record)."""
        if reason is None:
            return replace(self, endpoint=endpoint)
        return replace(self, endpoint=endpoint, moved_at=time.time() if at is None else at,
                       move_reason=reason)

    @classmethod
    def decode(cls, key: str, value: bytes, revision: int) -> Binding:
        pool, _, session = key.partition("/")
        data = json.loads(value)
        # Records written before moves were recorded carry neither field; an unknown reason (a
        # newer writer's) is shown as no reason rather than refusing the binding.
        reason = data.get("reason")
        known = reason in MoveReason.__members__.values()
        return cls(session, pool, str(data["endpoint"]), revision, int(data.get("hash", 0)),
                   float(data.get("moved_at", 0.0)) if known else 0.0,
                   MoveReason(reason) if known else None)


def binding_key(pool: str, session: str) -> str:
    return f"{pool}/{session}"
