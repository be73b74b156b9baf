"""The ADS stream state machine (state of the world): one per connected Envoy.

Per type: the names Envoy asked for, the version and nonce last sent, the version it accepted.
A request whose nonce is not the latest one sent for its type is stale and ignored. A NACK is
logged, counted and shown in status, and the rejected version is not sent again: the stream
holds until the snapshot changes. Responses go out in CDS → EDS → LDS → RDS order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import grpc
import structlog
from envoy.service.discovery.v3 import discovery_pb2

from control_plane.resources.types import NAMED, TYPE_ORDER, short
from control_plane.status import NodeStatus
from control_plane.xds.cache import Snapshot, SnapshotCache
from control_plane.xds.metrics import XdsMetrics

log = structlog.get_logger("kvgate.xds")


@dataclass
class _TypeState:
    names: set[str] | None = None  # None: wildcard
    sent_version: str | None = None
    nonce: str | None = None
    acked_version: str | None = None
    nacked_version: str | None = None


@dataclass
class NodeRegistry:
    """Envoys connected to this replica, for `kvgate status`."""

    nodes: dict[int, NodeStatus] = field(default_factory=dict)

    def snapshot(self) -> tuple[NodeStatus, ...]:
        return tuple(self.nodes.values())


# The ADS context: what a stream reads from Envoy and sends it.
Context = grpc.aio.ServicerContext[discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse]


class AdsServer:
    """Both of ADS's methods (ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server
    takes any object with them)."""

    def __init__(self, cache: SnapshotCache, metrics: XdsMetrics, registry: NodeRegistry) -> None:
        self._cache = cache
        self._metrics = metrics
        self._registry = registry
        self._streams = 0

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: Context,
    ) -> None:
        self._streams += 1
        stream = _Stream(self._streams, self._cache, self._metrics, self._registry, context)
        self._metrics.connected.inc()
        try:
            await stream.run()
        finally:
            self._metrics.connected.dec()
            self._registry.nodes.pop(stream.id, None)

    async def DeltaAggregatedResources(
        self, request_iterator: object, context: Context
    ) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "kvgate serves state-of-the-world ADS")


class _Stream:
    def __init__(
        self, stream_id: int, cache: SnapshotCache, metrics: XdsMetrics, registry: NodeRegistry,
        context: Context,
    ) -> None:
        self.id = stream_id
        self._cache = cache
        self._metrics = metrics
        self._registry = registry
        self._context = context
        self._types: dict[str, _TypeState] = {}
        self._nonce = 0
        self._node: NodeStatus | None = None

    async def run(self) -> None:
        requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(requests))
        snapshot = self._cache.current
        try:
            while True:
                next_request = asyncio.create_task(requests.get())
                newer = asyncio.create_task(self._cache.wait_newer(snapshot))
                done, pending = await asyncio.wait(
                    {next_request, newer}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in pending:
                    task.cancel()
                if newer in done:
                    snapshot = newer.result()
                    await self._push_all(snapshot)
                if next_request in done:
                    request = next_request.result()
                    if request is None:
                        return
                    await self._on_request(request, self._cache.current)
        finally:
            reader.cancel()

    async def _read(self, requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None]) -> None:
        try:
            while True:
                request = await self._context.read()
                if request is grpc.aio.EOF:
                    break
                await requests.put(request)
        finally:
            await requests.put(None)

    async def _on_request(
        self, request: discovery_pb2.DiscoveryRequest, snapshot: Snapshot | None
    ) -> None:
        if self._node is None:
            self._node = NodeStatus(request.node.id, request.node.cluster, time.time())
            self._registry.nodes[self.id] = self._node
            log.info("xds_node_connected", node=request.node.id)
        type_url = request.type_url
        state = self._types.setdefault(type_url, _TypeState())
        if request.response_nonce and request.response_nonce != state.nonce:
            self._metrics.stale.inc()
            return  # an answer to a response Envoy has since been superseded by
        names = set(request.resource_names) if type_url in NAMED else None
        names_changed = names != state.names
        state.names = names
        if request.response_nonce and request.HasField("error_detail"):
            state.nacked_version = state.sent_version
            self._metrics.nacks.labels(short(type_url)).inc()
            self._update_node(nack=(request.error_detail.message, state.sent_version))
            log.warning("xds_nack", node=request.node.id or self._node.node_id,
                        type=short(type_url), version=state.sent_version,
                        error=request.error_detail.message)
            return
        if request.response_nonce:
            state.acked_version = request.version_info
            self._update_node(acked=(type_url, request.version_info))
            if not names_changed:
                return
        if snapshot is not None:
            await self._respond(type_url, state, snapshot, force=names_changed)

    async def _push_all(self, snapshot: Snapshot) -> None:
        for type_url in TYPE_ORDER:
            state = self._types.get(type_url)
            if state is not None:
                await self._respond(type_url, state, snapshot, force=False)

    async def _respond(
        self, type_url: str, state: _TypeState, snapshot: Snapshot, *, force: bool
    ) -> None:
        version = snapshot.versions.get(type_url)
        if version is None or version == state.nacked_version:
            return  # rejected before: hold until the snapshot changes
        if version == state.sent_version and not force:
            return
        self._nonce += 1
        state.nonce = str(self._nonce)
        state.sent_version = version
        response = discovery_pb2.DiscoveryResponse(
            version_info=version, type_url=type_url, nonce=state.nonce
        )
        for resource in snapshot.of(type_url, state.names):
            response.resources.add().Pack(resource)
        self._metrics.responses.labels(short(type_url)).inc()
        await self._context.write(response)

    def _update_node(
        self, *, acked: tuple[str, str] | None = None, nack: tuple[str, str | None] | None = None
    ) -> None:
        if self._node is None:
            return
        node = self._node
        if acked is not None:
            node = replace(node, acked={**node.acked, acked[0]: acked[1]})
        if nack is not None:
            node = replace(node, nacks=node.nacks + 1, last_nack=nack[0],
                           last_nack_version=nack[1])
        self._node = node
        self._registry.nodes[self.id] = node
