"""WatchFleetLoad: the collector's rounds, streamed to each ext_proc replica over the admin API
(one stream per replica, however many engines). Each round is encoded once, with every
figure's age as the round ends, and the same message goes to every stream."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.contract.vllm import GAUGES
from kvgate.fleet.collector import FleetCollector, Residency


class FleetStream:
    """Serves the collector's rounds while this replica collects; otherwise refuses with
    FAILED_PRECONDITION naming the leader, so a replica tries the next address it knows."""

    def __init__(self, collector: FleetCollector | None, identity: str,
                 leader: Callable[[], str | None]) -> None:
        self._collector = collector
        self._identity = identity
        self._leader = leader
        self._frame: tuple[int, pb.FleetLoad] | None = None  # the last round's message

    async def watch(
        self, context: grpc.aio.ServicerContext[pb.WatchFleetLoadRequest, pb.FleetLoad]
    ) -> AsyncIterator[pb.FleetLoad]:
        collector = self._collector
        if collector is None or not collector.wanted():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._refusal())
            return
        collector.watchers += 1
        sent: int | None = None  # the last round this stream sent
        try:
            while True:
                await collector.next_round()
                if not collector.wanted():
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._refusal())
                    return
                # Residency goes as changes: a stream's first message, or one after rounds it
                # missed, carries all of it instead.
                yield self.frame(collector, full=sent is None or collector.rounds != sent + 1)
                sent = collector.rounds
        finally:
            collector.watchers -= 1

    def frame(self, collector: FleetCollector, full: bool = False) -> pb.FleetLoad:
        """The round's message (built once for every stream), or with every session's
        residency for one stream that needs it all."""
        if self._frame is None or self._frame[0] != collector.rounds:
            ages = collector.ages()
            # Each gauge's column, named as the gauge (kvgate.contract.vllm.GAUGES).
            columns: dict[str, Any] = {g.name: [a.figures.values[i] for a in ages]
                                       for i, g in enumerate(GAUGES)}
            evicting = [collector.eviction_rate(a.address) for a in ages]
            message = pb.FleetLoad(
                round=collector.rounds, interval_s=collector.refresh_s,
                collector=self._identity,
                loads=pb.EngineLoads(
                    endpoint=[a.address for a in ages],
                    **columns,
                    age_s=[a.age_s for a in ages],
                    eviction_rate=([math.nan if r is None else r for r in evicting]
                                   if any(r is not None for r in evicting) else [])),
                residency=_residency(collector.residency_changed),
                residency_lost=collector.residency_lost)
            self._frame = (collector.rounds, message)
        if not full:
            return self._frame[1]
        whole = pb.FleetLoad()
        whole.CopyFrom(self._frame[1])
        del whole.residency[:]
        whole.residency.extend(_residency(collector.residency()))
        whole.residency_full = True
        return whole

    def _refusal(self) -> str:
        if self._collector is None:
            return "this control plane runs no fleet-state collector"
        leader = self._leader()
        if not self._collector.configured():
            return "placement.load_gate.source is not collector here (or the gate is off)"
        return (f"not collecting: {self._identity} does not lead; the leader is "
                f"{leader or 'not elected yet'}")


def _residency(entries: list[Residency]) -> list[pb.SessionResidency]:
    return [pb.SessionResidency(endpoint=r.endpoint, session=r.session, tokens=r.tokens or 0,
                                unknown=r.tokens is None, stored=r.stored or 0)
            for r in entries]
