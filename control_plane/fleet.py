"""The fleet-state collector as a control-plane replica runs it (`placement.load_gate.source:
collector`): it collects while this replica leads, with the running config's interval (a
reload applies at the next round), and its rounds go out on the admin API's WatchFleetLoad."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from control_plane.admin.fleet_stream import FleetStream
from control_plane.leader import LeaderElection
from control_plane.status import CollectorStatus
from kvgate.config import Config
from kvgate.endpoints import EndpointDirectory
from kvgate.fleet.collector import CollectorSettings, FleetCollector
from kvgate.fleet.scrape import EngineScrapeMetrics
from kvgate.routing.engine_load import scrape_timeout


class ControlPlaneCollector:
    """The collector over `directory`'s active engines, its stream, and its line in status."""

    def __init__(self, config: Callable[[], Config], leader: LeaderElection,
                 directory: EndpointDirectory, registry: CollectorRegistry) -> None:
        self._config = config
        self._leader = leader
        self.collector = FleetCollector(directory.active_addresses, self.settings,
                                        EngineScrapeMetrics(registry, "control_plane"))
        self.stream = FleetStream(self.collector, leader.identity, lambda: leader.leader)

    def settings(self) -> CollectorSettings:
        gate = self._config().placement.load_gate
        return CollectorSettings(
            configured=gate.feed == "collector", leading=self._leader.leading,
            refresh_s=gate.refresh_s, timeout_s=scrape_timeout(gate.max_load_age_s,
                                                               gate.refresh_s), gate=gate)

    def status(self) -> CollectorStatus | None:
        """None when the load gate uses no collector."""
        collector = self.collector
        if not collector.configured():
            return None
        return CollectorStatus(collector.collecting, collector.engines, collector.watchers,
                               collector.refresh_s, collector.rounds)
