"""Modes in parallel: one forked worker per chunk of modes (the workload is shared by fork,
never pickled); results come back through a queue."""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable, Sequence

from bench.modes import Mode
from bench.report import ModeStats
from simulator.run import SimConfig, simulate
from workload.hashing import PromptBlocks
from workload.model import Workload


def simulate_modes(workload: Workload, modes: Sequence[Mode], config: SimConfig, jobs: int,
                   blocks: PromptBlocks | None = None,
                   meanwhile: Callable[[], None] | None = None,
                   on_done: Callable[[Mode, float], None] | None = None,
                   ) -> dict[Mode, tuple[ModeStats, float]]:
    """``{mode: (stats, seconds)}`` in ``modes`` order, using up to ``jobs`` processes.

    ``meanwhile`` runs in this process while the workers simulate (the oracle, say);
    ``on_done(mode, seconds)`` hears of each mode as it finishes."""
    jobs = max(1, min(jobs, len(modes)))
    report = on_done or (lambda mode, seconds: None)
    if jobs == 1:
        if meanwhile is not None:
            meanwhile()
        finished: dict[Mode, tuple[ModeStats, float]] = {}
        for mode in modes:
            finished[mode] = _timed(workload, mode, config, blocks)
            report(mode, finished[mode][1])
        return finished
    ctx = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[tuple[Mode, ModeStats, float] | tuple[Mode, None, str]] = (
        ctx.Queue())

    def work(chunk: Sequence[Mode]) -> None:
        for mode in chunk:
            try:
                stats, seconds = _timed(workload, mode, config, blocks)
                results.put((mode, stats, seconds))
            except Exception as exc:  # reported by the parent
                results.put((mode, None, repr(exc)))

    workers = [ctx.Process(target=work, args=(modes[i::jobs],), daemon=True)
               for i in range(jobs)]
    for worker in workers:
        worker.start()
    done: dict[Mode, tuple[ModeStats, float]] = {}
    try:
        if meanwhile is not None:
            meanwhile()
        while len(done) < len(modes):
            try:
                mode, stats, extra = results.get(timeout=1.0)
            except queue.Empty:
                if not any(w.is_alive() for w in workers) and results.empty():
                    raise RuntimeError("a simulation worker died") from None
                continue
            if stats is None:
                raise RuntimeError(f"simulating {mode} failed: {extra}")
            done[mode] = (stats, float(extra))
            report(mode, float(extra))
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        results.close()
        results.join_thread()
    return {m: done[m] for m in modes}


def _timed(workload: Workload, mode: Mode, config: SimConfig,
           blocks: PromptBlocks | None) -> tuple[ModeStats, float]:
    start = time.perf_counter()
    stats = simulate(workload, mode, config, blocks).stats
    return stats, time.perf_counter() - start
