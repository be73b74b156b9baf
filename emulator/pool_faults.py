"""Windows in which the DDR pool is down or slow, for the simulator and the emulator (pure).

``--pool-fail T@DURATION``: from emulated second T for DURATION seconds the pool answers no
lookup (every block is a miss, as an engine's connector treats an unreachable pool), stores
nothing, and comes back **empty**: a MemCache MetaService in single-point mode, or a Mooncake
master, keeps its index in memory, so a restarted one has lost where every block was.
``--pool-slow T@DURATION:FACTOR``: the pool's links keep FACTOR (0 < FACTOR <= 1) of their
bandwidth during the window (a failed NIC or node, a neighbour's traffic).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolWindow:
    """From ``start`` for ``duration`` emulated seconds the pool keeps ``factor`` of its
    bandwidth; ``factor`` 0 means it is down."""

    start: float
    duration: float
    factor: float = 0.0

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def down(self) -> bool:
        return self.factor == 0.0

    def describe(self) -> dict[str, float]:
        return {"start": self.start, "duration": self.duration, "factor": self.factor}


def parse_window(text: str, slow: bool) -> PoolWindow:
    """``T@DURATION`` (a failure) or ``T@DURATION:FACTOR`` (``slow``); ValueError names the
    expected form."""
    form = "T@DURATION:FACTOR (e.g. 1800@600:0.25)" if slow else "T@DURATION (e.g. 1800@600)"
    when, _, rest = text.partition("@")
    length, _, factor_text = rest.partition(":")
    try:
        start, duration = float(when), float(length)
        factor = float(factor_text) if slow else 0.0
    except ValueError:
        raise ValueError(f"expected {form}, got {text!r}") from None
    if bool(factor_text) != slow:
        raise ValueError(f"expected {form}, got {text!r}")
    if start < 0 or duration <= 0:
        raise ValueError(f"{text!r}: T must be >= 0 and DURATION > 0")
    if slow and not 0 < factor <= 1:
        raise ValueError(f"{text!r}: FACTOR must be in (0, 1]")
    return PoolWindow(start, duration, factor)


def pool_window(slow: bool) -> Callable[[str], PoolWindow]:
    """argparse type of ``--pool-fail`` (``slow`` False) and ``--pool-slow``."""

    def parse(text: str) -> PoolWindow:
        try:
            return parse_window(text, slow)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


class PoolFaults:
    """The pool's state over time, from its windows (overlaps: the worst one wins)."""

    def __init__(self, windows: Sequence[PoolWindow] = ()) -> None:
        self.windows = tuple(sorted(windows, key=lambda w: w.start))

    def __bool__(self) -> bool:
        return bool(self.windows)

    def factor(self, t: float) -> float:
        """The share of bandwidth the pool has at ``t`` (0: down, 1: healthy)."""
        return min((w.factor for w in self.windows if w.start <= t < w.end), default=1.0)

    def down(self, t: float) -> bool:
        return self.factor(t) == 0.0

    def changes(self) -> list[float]:
        """Every instant the pool's state may change, in order."""
        return sorted({t for w in self.windows for t in (w.start, w.end)})

    def recovered_at(self, t: float) -> bool:
        """A failure window ends at ``t`` and the pool is up from then: it comes back empty."""
        return any(w.down and w.end == t for w in self.windows) and not self.down(t)
