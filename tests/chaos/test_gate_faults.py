"""The load gate under bad engine metrics, with traffic whose prompts it prices (16 KB bodies,
about 4,000 tokens each): one engine's /metrics hangs, answers late, or lies (a thousand
requests waiting that it does not have). The targets: no request fails or waits on a scrape, a
figure that does not come counts for nothing (no session moves), and a lie moves each session at
most once and never back and forth.

    python -m pytest -m chaos tests/chaos/test_gate_faults.py -s
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.chaos import Account, Served, Traffic, engines_by_session, runs
from tests.support.chaos_run import FULL, Scene, recovered, under_traffic
from tests.support.metrics_faults import FaultyMetricsUpstream, MetricsFault
from tests.support.upstreams import Upstream

FAULT_S = 60.0 if FULL else 8.0
BODY_BYTES = 16_000
# Engines about as fast as these upstreams answer (a request's fixed cost 3 ms; a 4,000-token
# prompt 4 ms more, a sticky turn's cached one nothing), so the gate's own ledger of the work it
# sent sees them lightly loaded at this traffic (~100 requests a second each), as they are; a
# lie of a thousand waiting requests is then ~3 s of backlog, past `min_saving_s`. With the
# default fixed cost (20 ms) the ledger saw the four engines as overloaded at this traffic,
# seconds of backlog each, and moved sessions for load whatever the lie did.
PLACEMENT: dict[str, object] = {"engine_cost": {"prefill_tokens_per_s": 1_000_000,
                                                "prefill_overhead_s": 0.003}}


async def run(tmp_path: Path, prefix: str, fault: MetricsFault, source: str = "scrape"
              ) -> tuple[Account, list[Served], FaultyMetricsUpstream]:
    """Four engines; the first one's /metrics turns bad two seconds in, for FAULT_S. `source`:
    where the replicas get the engines' load (`placement.load_gate.source`)."""
    ups = [FaultyMetricsUpstream() for _ in range(4)]
    try:
        for u in ups:
            await u.start()
        bad = ups[0]
        traffics: list[Traffic] = []

        def traffic(url: str) -> Traffic:
            traffics.append(Traffic(url, body_bytes=BODY_BYTES))
            return traffics[-1]

        async def turn_bad(scene: Scene) -> tuple[str, int]:
            await asyncio.sleep(2.0)  # traffic under way first (the schedule, not readiness)
            scrapes = bad.scrapes
            bad.fault = fault
            await asyncio.sleep(FAULT_S)
            bad.fault = MetricsFault.NONE
            scene.ended()
            await asyncio.sleep(2.0)  # traffic after it is honest again
            assert bad.scrapes > scrapes, "no scrape reached the faulty engine"
            return f"{bad.address}'s /metrics {fault} for {FAULT_S:g} s", 1

        placement = {**PLACEMENT, "load_gate": {"source": source}}
        row = await under_traffic(tmp_path, list[Upstream](ups), prefix, turn_bad,
                                  placement=placement, traffic=traffic)
        return row, traffics[0].served, bad
    finally:
        for u in ups:
            await u.stop()


@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", [MetricsFault.NONE, MetricsFault.HANG, MetricsFault.SLOW])
async def test_metrics_that_do_not_come_move_no_session(
        tmp_path: Path, prefix: str, fault: MetricsFault) -> None:
    row, _, _ = await run(tmp_path, prefix, fault)
    assert row.requests > 100 and row.sessions > 20, row
    assert (row.failed, row.cut, row.split, row.lost) == (0, 0, 0, 0), row
    recovered(row)


@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize("source", ["scrape", "collector"])
async def test_a_lying_deep_queue_moves_each_session_at_most_once(
        tmp_path: Path, prefix: str, source: str) -> None:
    """Each session's turns reach one replica (the ext_proc cluster hashes the session header),
    so the replica that moved a session away from the lie also holds its cooldown: no other
    replica moves it back when the lie ends (docs/faults.md)."""
    row, served, bad = await run(tmp_path, prefix, MetricsFault.DEEP_QUEUE, source)
    assert row.requests > 100 and row.sessions > 20, row
    assert (row.failed, row.cut, row.interleaved, row.lost) == (0, 0, 0, 0), row
    recovered(row)
    moved = {s: runs(e) for s, e in engines_by_session(served).items() if len(set(e)) > 1}
    assert moved, "the lie moved no session: the run tested nothing"
    # Only sessions on the engine that claims the queue move, once, away from it (however many
    # turns they had there first).
    wrong = {s: e for s, e in moved.items() if e[0] != bad.address or len(e) > 2}
    assert not wrong, (bad.address, [t for t in row.on_two if t.split(":", 1)[0] in wrong])


