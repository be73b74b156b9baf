"""An ext_proc replica's record of what each engine's HBM holds of each session, and how fast
each engine evicts, as the fleet-state collector's stream last said
(`placement.load_gate.kv_events_port`): the gate's `HbmResidency`. Nothing known (a session
never reported, an engine whose events were missed, the stream lost) answers None, and the gate
prices staying as before: the context still there.
"""

from __future__ import annotations

import math

from kvgate.admin_api.v1 import admin_pb2 as pb


class HbmBoard:
    """Engine → session → (leading tokens in its HBM, tokens it last stored there), and
    engine → blocks evicted per second; updated by :meth:`apply`."""

    def __init__(self) -> None:
        self._tokens: dict[str, dict[str, tuple[int, int]]] = {}
        self._evicting: dict[str, float] = {}

    @property
    def pairs(self) -> int:
        """(engine, session) pairs held: a session in two engines' HBM counts twice."""
        return sum(len(held) for held in self._tokens.values())

    def _entry(self, endpoint: str, session: str) -> tuple[int, int] | None:
        held = self._tokens.get(endpoint)
        return None if held is None else held.get(session)

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        entry = self._entry(endpoint, session)
        return None if entry is None else min(entry[0], context_tokens)

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        """Held over stored (kvgate.fleet.residency ``stored_tokens``); None: not known, or
        what it stored is not (a collector from before the field sends 0)."""
        entry = self._entry(endpoint, session)
        if entry is None or entry[1] <= 0:
            return None
        return min(1.0, entry[0] / entry[1])

    @property
    def engines_evicting(self) -> int:
        """Engines whose eviction rate the last round gave."""
        return len(self._evicting)

    def eviction_rate(self, endpoint: str) -> float | None:
        return self._evicting.get(endpoint)

    def apply(self, frame: pb.FleetLoad) -> None:
        """One collector round's residency: every session (``residency_full``) or changes;
        and every engine's eviction rate (each round has them all)."""
        loads = frame.loads
        self._evicting = {endpoint: rate for endpoint, rate in zip(
            loads.endpoint, loads.eviction_rate, strict=False) if not math.isnan(rate)}
        tokens = self._tokens
        if frame.residency_full:
            tokens.clear()
        for engine in frame.residency_lost:
            tokens.pop(engine, None)
        for entry in frame.residency:
            if entry.unknown:
                held = tokens.get(entry.endpoint)
                if held is not None:
                    held.pop(entry.session, None)
            else:
                tokens.setdefault(entry.endpoint, {})[entry.session] = (entry.tokens,
                                                                         entry.stored)

    def clear(self) -> None:
        """The stream is lost: nothing is known until the next one's first message."""
        self._tokens.clear()
        self._evicting.clear()
