"""Immutable snapshots of Envoy's whole configuration, versioned per resource type.

Versions are `{boot}-{n}`: `boot` is fixed at process start from the clock, so a restarted
control plane never reuses a version Envoy already holds; a type's version changes only when its
resources do, so unchanged types are not re-sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from google.protobuf.message import Message

from control_plane.resources.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, TYPE_ORDER

Resources = Mapping[str, Mapping[str, Message]]  # type URL → resource name → message


class InconsistentSnapshot(ValueError):
    """A snapshot that would leave Envoy with dangling references; never published."""


@dataclass(frozen=True)
class Snapshot:
    version: str  # of the snapshot as a whole
    versions: Mapping[str, str]  # per type URL
    resources: Resources

    def of(self, type_url: str, names: set[str] | None = None) -> list[Message]:
        found = self.resources.get(type_url, {})
        if names is None:
            return list(found.values())
        return [found[n] for n in sorted(names) if n in found]


def check_consistency(resources: Resources) -> list[str]:
    """Every EDS cluster has endpoints, every RDS name has routes, every route's cluster exists."""
    problems = []
    clusters: Mapping[str, cluster_pb2.Cluster] = resources.get(CLUSTER, {})
    assignments = resources.get(ENDPOINT, {})
    routes: Mapping[str, route_pb2.RouteConfiguration] = resources.get(ROUTE, {})
    for name, cluster in clusters.items():
        if cluster.type == cluster_pb2.Cluster.EDS and name not in assignments:
            problems.append(f"cluster {name}: no endpoints (EDS) resource")
    for name in assignments:
        if name not in clusters:
            problems.append(f"endpoints {name}: no such cluster")
    listener: listener_pb2.Listener
    for listener in resources.get(LISTENER, {}).values():
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                manager = hcm.HttpConnectionManager()
                if network_filter.typed_config.Unpack(manager) and manager.HasField("rds"):
                    if manager.rds.route_config_name not in routes:
                        problems.append(f"listener {listener.name}: no route configuration "
                                        f"{manager.rds.route_config_name}")
    for route_config in routes.values():
        for host in route_config.virtual_hosts:
            for route in host.routes:
                if route.route.cluster and route.route.cluster not in clusters:
                    problems.append(f"route {route.name}: no cluster {route.route.cluster}")
    return problems


def _digest(resources: Mapping[str, Message]) -> str:
    h = hashlib.sha256()
    for name in sorted(resources):
        h.update(name.encode())
        h.update(resources[name].SerializeToString(deterministic=True))
    return h.hexdigest()


class SnapshotCache:
    """Holds the current snapshot and wakes streams when it changes. No gRPC here."""

    def __init__(self, boot: str | None = None) -> None:
        self._boot = boot or f"{time.time_ns():x}"
        self._counter = 0
        self._digests: dict[str, str] = {}
        self._versions: dict[str, str] = {}
        self._current: Snapshot | None = None
        self._changed = asyncio.Condition()

    @property
    def current(self) -> Snapshot | None:
        return self._current

    async def publish(self, resources: Resources, *, check: bool = True) -> Snapshot:
        """Checks and publishes a new snapshot; raises InconsistentSnapshot, keeping the old one."""
        if check:
            problems = check_consistency(resources)
            if problems:
                raise InconsistentSnapshot("; ".join(problems))
        changed = False
        versions = dict(self._versions)
        for type_url in TYPE_ORDER:
            digest = _digest(resources.get(type_url, {}))
            if self._digests.get(type_url) != digest:
                self._counter += 1
                versions[type_url] = f"{self._boot}-{self._counter}"
                self._digests[type_url] = digest
                changed = True
        if not changed and self._current is not None:
            return self._current
        self._versions = versions
        frozen = MappingProxyType({
            t: MappingProxyType(dict(resources.get(t, {}))) for t in TYPE_ORDER
        })
        self._current = Snapshot(f"{self._boot}-{self._counter}", MappingProxyType(versions),
                                 frozen)
        async with self._changed:
            self._changed.notify_all()
        return self._current

    async def wait_newer(self, than: Snapshot | None) -> Snapshot:
        async with self._changed:
            await self._changed.wait_for(lambda: self._current is not None
                                         and self._current is not than)
        assert self._current is not None
        return self._current
