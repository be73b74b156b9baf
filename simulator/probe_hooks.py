"""What the simulator's probes (peak_probe, move_probe, link_probe, drift_probe) hook into
this process's simulation: each engine's admissions (the instant a request was admitted), each
request placed on an engine (its slot's times) and each request sent (which engine took it).
A probe hands in what it records; the hooks wrap the classes, changing no decision. And the
percentile the probes print (`pct`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from emulator.engine_model import EngineModel
from simulator.simulation import Simulation


class Admitting(Protocol):
    last_admit: float  # the clock at the latest admission, read when the request is placed


def on_admit(probe: Admitting) -> None:
    """`probe.last_admit` follows every engine's admissions."""
    admit = EngineModel.admit

    def admit_probe(self: EngineModel, now: float, *a: Any, **k: Any) -> Any:
        probe.last_admit = now
        return admit(self, now, *a, **k)

    EngineModel.admit = admit_probe  # type: ignore[method-assign]


def on_place(record: Callable[[Simulation, int, int, Any], None]) -> None:
    """`record(simulation, engine, request, admission)` before each request is placed."""
    place = Simulation._place

    def place_probe(self: Simulation, e: int, i: int, admission: Any, ask: Any) -> None:
        record(self, e, i, admission)
        place(self, e, i, admission, ask)

    Simulation._place = place_probe  # type: ignore[method-assign]


def on_send(record: Callable[[Simulation, int, int], None]) -> None:
    """`record(simulation, engine, request)` before each request is sent to its engine (as it
    arrives there: every simulation's `_send` starts with `_arrive`)."""
    arrive = Simulation._arrive

    def send_probe(self: Simulation, e: int, i: int, ask: Any, hashes: Any,
                   now: float) -> Any:
        record(self, e, i)
        return arrive(self, e, i, ask, hashes, now)

    Simulation._arrive = send_probe  # type: ignore[method-assign]


def pct(values: list[float], q: float) -> float:
    """The `q`th percentile as the probes print it: the value at index q/100 x n of the sorted
    values (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]
