"""Simulations in parallel: forked workers take runs (a mode on a fleet) from a shared queue, so
the workload is shared by fork, never pickled; results come back through another queue."""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import TypeAlias

from benchkit.report import ModeStats
from kvgate.contract.modes import PdMode, RoutingMode
from simulator.run import SimConfig, simulate
from workload.hashing import PromptBlocks
from workload.model import Workload

Mode: TypeAlias = RoutingMode | PdMode
Run = tuple[Mode, SimConfig]
# What a worker sends back: the run's index, its stats and seconds, or None and the error.
_Results: TypeAlias = "multiprocessing.Queue[tuple[int, ModeStats | None, float | str]]"

# Relative time of a mode's run (1,000 engines: about 37, 32, 20 and 15 s): the longest start
# first, so the short ones fill in behind them instead of leaving one worker on a long run alone.
_WORK: dict[Mode, int] = {
    RoutingMode.ROUND_ROBIN_DDR: 5, RoutingMode.PREFIX_SCORE: 5, RoutingMode.KV_COST: 5,
    RoutingMode.AFFINITY_DDR: 4, RoutingMode.STICKY_DDR: 4, RoutingMode.BOUNDED_HASH: 4,
    RoutingMode.AFFINITY: 3, RoutingMode.RING_HASH: 2, RoutingMode.ROUND_ROBIN: 1}


def simulate_modes(workload: Workload, modes: Sequence[Mode], config: SimConfig, jobs: int,
                   blocks: PromptBlocks | None = None,
                   meanwhile: Callable[[], None] | None = None,
                   on_done: Callable[[Mode, float], None] | None = None,
                   ) -> dict[Mode, tuple[ModeStats, float]]:
    """``{mode: (stats, seconds)}`` in ``modes`` order, using up to ``jobs`` processes.

    ``meanwhile`` runs in this process while the workers simulate (the oracle, say);
    ``on_done(mode, seconds)`` hears of each mode as it finishes."""
    report = on_done or (lambda mode, seconds: None)
    results = simulate_runs(workload, [(m, config) for m in modes], jobs, blocks, meanwhile,
                            lambda i, seconds: report(modes[i], seconds))
    return dict(zip(modes, results, strict=True))


def simulate_runs(workload: Workload, runs: Sequence[Run], jobs: int,
                  blocks: PromptBlocks | None = None,
                  meanwhile: Callable[[], None] | None = None,
                  on_done: Callable[[int, float], None] | None = None,
                  ) -> list[tuple[ModeStats, float]]:
    """``(stats, seconds)`` per run, in ``runs`` order, using up to ``jobs`` processes;
    ``on_done(index, seconds)`` hears of each run as it finishes."""
    # One run still goes to a worker when there is other work to do meanwhile (the oracle).
    parallel = jobs > 1 and (len(runs) > 1 or meanwhile is not None)
    jobs = max(1, min(jobs, len(runs)))
    report = on_done or (lambda index, seconds: None)
    if not parallel:
        if meanwhile is not None:
            meanwhile()
        finished: list[tuple[ModeStats, float]] = []
        for index, (mode, config) in enumerate(runs):
            finished.append(_timed(workload, mode, config, blocks))
            report(index, finished[-1][1])
        return finished
    return _in_workers(workload, runs, jobs, blocks, meanwhile, report)


def _in_workers(workload: Workload, runs: Sequence[Run], jobs: int, blocks: PromptBlocks | None,
                meanwhile: Callable[[], None] | None, report: Callable[[int, float], None],
                ) -> list[tuple[ModeStats, float]]:
    """``simulate_runs`` over ``jobs`` forked workers, the longest runs first."""
    ctx = multiprocessing.get_context("fork")
    todo: multiprocessing.Queue[int | None] = ctx.Queue()
    longest_first = sorted(range(len(runs)), key=lambda i: -_WORK.get(runs[i][0], 3))
    for queued in [*longest_first, *[None] * jobs]:  # None: no more runs for this worker
        todo.put(queued)
    results: _Results = ctx.Queue()

    def work() -> None:
        while (index := todo.get()) is not None:
            mode, config = runs[index]
            try:
                stats, seconds = _timed(workload, mode, config, blocks)
                results.put((index, stats, seconds))
            except Exception as exc:  # reported by the parent
                results.put((index, None, repr(exc)))

    workers = [ctx.Process(target=work, daemon=True) for _ in range(jobs)]
    for worker in workers:
        worker.start()
    try:
        if meanwhile is not None:
            meanwhile()
        done = _gather(results, workers, runs, report)
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        for channel in (todo, results):
            channel.close()
            channel.join_thread()
    return [done[i] for i in range(len(runs))]


def _gather(results: _Results, workers: Sequence[BaseProcess], runs: Sequence[Run],
            report: Callable[[int, float], None]) -> dict[int, tuple[ModeStats, float]]:
    """Every run's result as the workers send it; an error if one failed or all died."""
    done: dict[int, tuple[ModeStats, float]] = {}
    while len(done) < len(runs):
        try:
            index, stats, extra = results.get(timeout=1.0)
        except queue.Empty:
            if not any(w.is_alive() for w in workers) and results.empty():
                raise RuntimeError("a simulation worker died") from None
            continue
        if stats is None:
            raise RuntimeError(f"simulating {runs[index][0]} failed: {extra}")
        done[index] = (stats, float(extra))
        report(index, float(extra))
    return done


def _timed(workload: Workload, mode: Mode, config: SimConfig,
           blocks: PromptBlocks | None) -> tuple[ModeStats, float]:
    start = time.perf_counter()
    stats = simulate(workload, mode, config, blocks).stats
    return stats, time.perf_counter() - start
