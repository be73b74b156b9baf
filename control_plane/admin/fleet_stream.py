"""WatchFleetLoad: the collector's rounds, streamed to each ext_proc replica over the admin API
(one stream per replica, however many engines). Each round is encoded once, with every
figure's age as the round ends, and the same message goes to every stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.fleet.collector import FleetCollector


class FleetStream:
    """Serves the collector's rounds while this replica collects; otherwise refuses with
    FAILED_PRECONDITION naming the leader, so a replica tries the next address it knows."""

    def __init__(self, collector: FleetCollector | None, identity: str,
                 leader: Callable[[], str | None]) -> None:
        self._collector = collector
        self._identity = identity
        self._leader = leader
        self._frame: tuple[int, pb.FleetLoad] | None = None  # the last round's message

    async def watch(self, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.FleetLoad]:
        collector = self._collector
        if collector is None or not collector.wanted():
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._refusal())
            return
        collector.watchers += 1
        try:
            while True:
                await collector.next_round()
                if not collector.wanted():
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._refusal())
                    return
                yield self.frame(collector)
        finally:
            collector.watchers -= 1

    def frame(self, collector: FleetCollector) -> pb.FleetLoad:
        if self._frame is None or self._frame[0] != collector.rounds:
            message = pb.FleetLoad(
                round=collector.rounds, interval_s=collector.refresh_s,
                collector=self._identity,
                engines=[pb.EngineLoad(endpoint=a.address, waiting=a.figures.waiting,
                                       running=a.figures.running, kv_usage=a.figures.kv_usage,
                                       age_s=a.age_s) for a in collector.ages()])
            self._frame = (collector.rounds, message)
        return self._frame[1]

    def _refusal(self) -> str:
        if self._collector is None:
            return "this control plane runs no fleet-state collector"
        leader = self._leader()
        if not self._collector.configured():
            return "placement.load_gate.source is not collector here (or the gate is off)"
        return (f"not collecting: {self._identity} does not lead; the leader is "
                f"{leader or 'not elected yet'}")
