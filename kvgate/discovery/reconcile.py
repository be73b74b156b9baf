"""What an appearance or a disappearance means, as pure logic: each source's resolutions in, the
pool's discovered engines out, as changes for the control plane to write to etcd.

- A new address is an engine that takes new sessions at once; no existing session moves.
- An address every source that had it has missed `misses` resolutions in a row (the source's
  hysteresis: DNS `discover.misses`, default 3; a registration's lost lease is 1, since its
  TTL already is one) is leaving: drained for `discover.drain`, then removed. Its probes failing
  first fails it as usual (health checks, not this module).
- An address that comes back while leaving is the same engine: undrained.
- A source that fails changes nothing: its engines stay, and its last good answer ages
  (`SourceStatus.last_good`).
- One round never starts more engines leaving than the pool's bound allows:
  floor(engines × health.max_failed_fraction), counting those already leaving (the health
  guard's rule, control_plane.health.guard); the rest stay active until a later round.
- Endpoints listed in the YAML are never discovered: the file's word wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvgate.contract.states import Role


@dataclass(frozen=True, slots=True)
class Found:
    """One engine as a source sees it."""

    address: str  # ip:port
    kv_pool: str
    weight: int = 1
    role: Role = Role.BOTH


@dataclass(frozen=True, slots=True)
class Resolution:
    """One answer of a source: the engines it names now, or None when it failed."""

    source: str
    found: tuple[Found, ...] | None
    at: float  # unix time
    error: str = ""


@dataclass(slots=True)
class SourceStatus:
    source: str
    last_good: float | None = None  # unix time of the last answer (None: none yet)
    last_error: str = ""  # the last failure since then ("" once an answer came)
    failures: int = 0  # failed resolutions in a row
    engines: int = 0  # addresses its last answer named


@dataclass(slots=True)
class Engine:
    found: Found
    source: str  # the first source that named it (what `endpoints list` shows)
    misses: dict[str, int] = field(default_factory=dict)  # source → misses in a row
    leaving_since: float | None = None  # unix time its drain began


@dataclass(frozen=True, slots=True)
class Changes:
    """What one round changes; the control plane writes it to the endpoint records."""

    added: tuple[Engine, ...] = ()  # new: active at once
    updated: tuple[Engine, ...] = ()  # kv_pool, weight or role changed
    returned: tuple[Engine, ...] = ()  # was leaving, named again: undrain
    leaving: tuple[Engine, ...] = ()  # drain starts now (deadline: + drain)
    removed: tuple[Engine, ...] = ()  # drain over: the record goes
    held: tuple[str, ...] = ()  # would leave, kept by the bound

    def __bool__(self) -> bool:
        return bool(self.added or self.updated or self.returned or self.leaving
                    or self.removed)


class Reconciler:
    """One pool's discovered engines."""

    def __init__(self, *, misses: dict[str, int], drain_s: float, max_fraction: float,
                 static: frozenset[str] = frozenset()) -> None:
        self._threshold = misses  # source → misses in a row that count as gone
        self._drain_s = drain_s
        self._max_fraction = max_fraction
        self._static = static
        self.engines: dict[str, Engine] = {}
        self.sources = {name: SourceStatus(name) for name in misses}

    def seed(self, engine: Engine) -> None:
        """An engine a previous leader wrote (its record), known again without a change."""
        self.engines.setdefault(engine.found.address, engine)

    def observe(self, resolution: Resolution) -> Changes:
        status = self.sources[resolution.source]
        if resolution.found is None:
            status.failures += 1
            status.last_error = resolution.error or "failed"
            return Changes()
        status.last_good, status.last_error, status.failures = resolution.at, "", 0
        named = {f.address: f for f in resolution.found if f.address not in self._static}
        status.engines = len(named)
        added, updated, returned = self._named(resolution.source, named)
        candidates = self._missed(resolution.source, named)
        leaving, held = self._bounded(candidates, resolution.at)
        return Changes(tuple(added), tuple(updated), tuple(returned), tuple(leaving),
                       held=tuple(held))

    def _named(self, source: str, named: dict[str, Found]
               ) -> tuple[list[Engine], list[Engine], list[Engine]]:
        added: list[Engine] = []
        updated: list[Engine] = []
        returned: list[Engine] = []
        for address, found in sorted(named.items()):
            engine = self.engines.get(address)
            if engine is None:
                engine = self.engines[address] = Engine(found, source)
                added.append(engine)
            elif engine.found != found and engine.source == source:
                engine.found = found
                updated.append(engine)
            engine.misses[source] = 0
            if engine.leaving_since is not None:
                engine.leaving_since = None
                returned.append(engine)
        return added, updated, returned

    def _missed(self, source: str, named: dict[str, Found]) -> list[Engine]:
        """Engines this answer left out; those no source names any more, longest missed first."""
        gone: list[tuple[int, str, Engine]] = []
        for address, engine in sorted(self.engines.items()):
            if address in named or source not in engine.misses:
                continue
            engine.misses[source] += 1
            over = engine.misses[source] >= self._threshold[source]
            if over and engine.leaving_since is None and all(
                    count >= self._threshold.get(s, 1) for s, count in engine.misses.items()):
                gone.append((-engine.misses[source], address, engine))
        return [engine for _, _, engine in sorted(gone)]

    def _bounded(self, candidates: list[Engine], now: float) -> tuple[list[Engine], list[str]]:
        total = len(self._static) + len(self.engines)
        limit = math.floor(total * self._max_fraction + 1e-9)
        already = sum(1 for e in self.engines.values() if e.leaving_since is not None)
        room = max(0, limit - already)
        leaving = candidates[:room]
        for engine in leaving:
            engine.leaving_since = now
        return leaving, [e.found.address for e in candidates[room:]]

    def expire(self, now: float) -> Changes:
        """Engines whose drain is over: their records go (sessions left move, as after a
        drain's deadline)."""
        removed = [e for e in self.engines.values()
                   if e.leaving_since is not None and now >= e.leaving_since + self._drain_s]
        for engine in removed:
            del self.engines[engine.found.address]
        return Changes(removed=tuple(removed))

    def deadline(self, engine: Engine) -> float | None:
        return None if engine.leaving_since is None else engine.leaving_since + self._drain_s

    def staleness(self, source: str, now: float) -> float | None:
        """Seconds since the source's last good answer (None: it never answered)."""
        last = self.sources[source].last_good
        return None if last is None else max(0.0, now - last)
