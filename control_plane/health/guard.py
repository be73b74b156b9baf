"""How many of a pool's engines probes may mark failed at once. Pure.

Like Envoy's outlier detection `max_ejection_percent`: when probes call most of a pool dead at
once, the prober (a starved control plane, a partitioned network) is the likelier culprit, and
failing them all would leave ext_proc nothing to route to. Past the limit, an engine probes call
dead keeps its state (and its traffic; Envoy's retries cover a truly dead one), and it is held
back, logged and counted.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Engine = TypeVar("Engine", bound=Hashable)  # whatever names an engine: an address, (pool, address)


def allowed_failures(size: int, max_failed_fraction: float) -> int:
    """How many of `size` engines may be failed by probes: `floor(size × fraction)`, so a pool
    of one is never failed by its probes unless the fraction is 1."""
    return math.floor(size * max_failed_fraction + 1e-9)


@dataclass(frozen=True, slots=True)
class Verdict(Generic[Engine]):
    failed: frozenset[Engine]  # engines to mark failed
    held: tuple[Engine, ...]  # engines probes call dead, kept active by the guard


def guard(
    failing: Sequence[Engine], failed: Collection[Engine], limit: int
) -> Verdict[Engine]:
    """`failing`: engines whose probes say dead, in the order they started failing; `failed`:
    those marked failed now. Engines already failed stay failed while they keep failing; new
    ones are failed first come, first served, up to `limit` in all."""
    staying = [a for a in failing if a in failed]
    newly = [a for a in failing if a not in failed]
    room = max(0, limit - len(staying))
    return Verdict(frozenset(staying + newly[:room]), tuple(newly[room:]))
