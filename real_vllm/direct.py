"""Calibration without the gateway (``calibrate --route direct``): the client sends each request
straight to an engine, choosing it as the mode would, for the real engines and the emulated ones
alike.

Why: on this two-core machine the gateway (Envoy, ext_proc, etcd, a control plane) and the
client share the engines' cores, and the calibration runs of 2026-12-05 found ~20 ms a request
under a workload that moved with wherever the gateway and the client ran, not with vLLM's front
end (docs/journal/real-vllm-calibration.md, "vLLM's front end on a core of its own"). Without
the gateway, what is left between the client's TTFT and the engine's is the client's own work,
so a gap that remains is the emulator's timing model, and one that closes was the gateway's CPU.

The routing is the client's, the same on both halves: round robin takes the engines in turn;
affinity places a session's first request on the engine holding the fewest sessions (the
earliest in turn on a tie) and keeps every later request of it there. kvgate places a new
session by bounded load over its ring, so which engine a session lands on can differ from a
gateway run's; both halves of one calibration share this router, so they compare alike.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from bench.client import DriveOptions, DriveResult, drive
from benchkit.fleet_options import emulator_flags
from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from real_vllm.calibrate import Route
from real_vllm.fleet import RealFleet
from stack.emulated import emulator_child, written
from workload.model import Workload

ROUTES = ("gateway", "direct")
Say = Callable[[str], None]
# The modes a client can route alone: no binding store, no load figures.
DIRECT_MODES = (RoutingMode.ROUND_ROBIN, RoutingMode.AFFINITY)


class DirectRoutes:
    """The engine each request goes to (its base URL), as ``mode`` would place it."""

    def __init__(self, mode: RoutingMode, urls: Sequence[str]) -> None:
        if mode not in DIRECT_MODES:
            raise ValueError(f"--route direct runs {', '.join(map(str, DIRECT_MODES))}, "
                             f"not {mode}")
        if not urls:
            raise ValueError("no engine to route to")
        self._mode = mode
        self._urls = list(urls)
        self._turn = 0
        self._sessions: dict[str, str] = {}
        self._held = dict.fromkeys(self._urls, 0)  # sessions placed on each engine

    def __call__(self, session: str) -> str:
        if self._mode is RoutingMode.ROUND_ROBIN:
            url = self._urls[self._turn % len(self._urls)]
            self._turn += 1
            return url
        bound = self._sessions.get(session)
        if bound is None:
            bound = min(self._urls, key=lambda u: (self._held[u], self._urls.index(u)))
            self._sessions[session] = bound
            self._held[bound] += 1
        return bound


def direct_options(mode: RoutingMode, urls: Sequence[str], label: str,
                   time_scale: float = 1.0) -> DriveOptions:
    return DriveOptions(urls[0], time_scale=time_scale, engines=list(urls), label=label,
                        route=DirectRoutes(mode, urls))


def direct_route(fleet: RealFleet, say: Say) -> Route:
    """real_vllm.calibrate.run_real's route without the gateway: the client sends each
    request to the engine the mode picks."""
    @asynccontextmanager
    async def route(mode: RoutingMode, workdir: Path) -> AsyncIterator[DriveOptions]:
        say(f"real {mode}: the client routing to {len(fleet.urls)} vLLM engines itself")
        yield direct_options(mode, fleet.urls, f"real {mode}")
    return route


async def run_emulated_direct(options: EmulatorOptions, workload: Workload,
                              modes: Sequence[RoutingMode], workdir: Path,
                              say: Say) -> dict[RoutingMode, DriveResult]:
    """Each mode's run through a fresh emulated fleet (``python -m emulator``, no DDR pool),
    the client routing as on the real half."""
    results: dict[RoutingMode, DriveResult] = {}
    for mode in modes:
        child, ready = emulator_child(options.instances, [
            "--time-scale", repr(options.time_scale), "--no-ddr-pool",
            *emulator_flags(options)], workdir / str(mode).replace("+", "-"))
        say(f"emulated {mode}: {options.instances} engines, the client routing itself")
        await child.start()
        try:
            await child.wait_ready(written(ready), within=60)
            urls = [f"http://{a}" for a in json.loads(ready.read_text())["engines"]]
            results[mode] = await drive(workload, direct_options(
                mode, urls, f"emulated {mode}", options.time_scale))
        finally:
            await child.stop()
    return results
