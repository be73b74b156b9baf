"""A binding: which endpoint of which pool serves a session."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from kvgate.contract.states import MoveReason


@dataclass(frozen=True, slots=True)
class MoveEstimate:
    """What a load gate's move estimated (kvgate.routing.gated): the time to first token on the
    engine moved to, in seconds per scoring term, and the estimate of staying."""

    terms: tuple[tuple[str, float], ...]
    stay_s: float


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
    estimate: MoveEstimate | None = None  # the last move's, if the load gate made it

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
            if self.estimate is not None:
                data["terms"] = dict(self.estimate.terms)
                data["stay_s"] = self.estimate.stay_s
        return json.dumps(data).encode()

    def moved_to(self, endpoint: str, reason: MoveReason | None,
                 at: float | None = None, estimate: MoveEstimate | None = None) -> Binding:
        """This binding moved to `endpoint` (now, unless `at`), for `reason`, with what the load
        gate estimated if it moved it (`reason` None: keeps its previous move's record)."""
        if reason is None:
            return replace(self, endpoint=endpoint)
        return replace(self, endpoint=endpoint, moved_at=time.time() if at is None else at,
                       move_reason=reason, estimate=estimate)

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
                   MoveReason(reason) if known else None, _estimate(data) if known else None)


def _estimate(data: dict[str, object]) -> MoveEstimate | None:
    terms, stay = data.get("terms"), data.get("stay_s")
    if not isinstance(terms, dict) or not isinstance(stay, int | float):
        return None
    return MoveEstimate(tuple((str(k), float(v)) for k, v in terms.items()), float(stay))


def binding_key(pool: str, session: str) -> str:
    return f"{pool}/{session}"
