"""The Admin gRPC servicer: translates between protos and `Operations`, which holds the logic."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from control_plane.admin.fleet_stream import FleetStream
from control_plane.discovery import SourceView
from control_plane.operations import (
    EndpointStatus,
    Invalid,
    NotFound,
    OperationError,
    Operations,
    SessionBinding,
)
from control_plane.status import CollectorStatus, ControlPlaneStatus, NodeStatus
from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.endpoints import EndpointRecord
from kvgate.etcd import EtcdError, EtcdNoSpace
from kvgate.etcd.mirror import MirrorStatus
from kvgate.replicas import REPORT_TTL, ReplicaReport

log = structlog.get_logger("kvgate.admin")

Request = TypeVar("Request")
Response = TypeVar("Response")
# A unary call's context: only its abort is used, so its messages' types do not matter here.
Context = grpc.aio.ServicerContext[Message, Message]
Method = Callable[["AdminServicer", Request, Context], Awaitable[Response]]


class BadRequest(Exception):
    """The request itself is malformed (missing field, negative number): INVALID_ARGUMENT."""


# The one place where failures become gRPC status codes. Operations' Invalid is about the fleet's
# current state (endpoint not active, session bound in several pools), hence FAILED_PRECONDITION.
_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Invalid, grpc.StatusCode.FAILED_PRECONDITION),
    (OperationError, grpc.StatusCode.FAILED_PRECONDITION),
    (EtcdNoSpace, grpc.StatusCode.RESOURCE_EXHAUSTED),  # the message names the kind
    (EtcdError, grpc.StatusCode.UNAVAILABLE),
)


def _mapped(method: Method[Request, Response]) -> Method[Request, Response]:
    @functools.wraps(method)
    async def wrapper(
        self: AdminServicer, request: Request, context: Context
    ) -> Response:
        try:
            return await method(self, request, context)
        except Exception as exc:
            for kind, code in _STATUS:
                if isinstance(exc, kind):
                    log.info("admin_refused", method=method.__name__, code=code.name,
                             reason=str(exc))
                    await context.abort(code, str(exc) or kind.__name__)
            log.exception("admin_failed", method=method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
            raise  # unreachable: abort raises; keeps type checkers sure nothing is returned

    return wrapper


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(
        self, operations: Operations, status: Callable[[], ControlPlaneStatus],
        fleet: FleetStream | None = None,
    ) -> None:
        self._ops = operations
        self._status = status
        self._fleet = fleet

    @_mapped
    async def ListEndpoints(
        self, request: pb.ListEndpointsRequest, context: Context
    ) -> pb.ListEndpointsResponse:
        found = await self._ops.list_endpoints(_optional(request, "pool"))
        # None leaves an optional field unset.
        return pb.ListEndpointsResponse(endpoints=[endpoint_status(s) for s in found.endpoints],
                                        sessions_note=found.sessions_note)

    @_mapped
    async def DrainEndpoint(
        self, request: pb.DrainEndpointRequest, context: Context
    ) -> pb.DrainEndpointResponse:
        deadline = request.deadline_seconds if request.HasField("deadline_seconds") else None
        if deadline is not None and not 0 <= deadline < float("inf"):
            raise BadRequest(f"deadline_seconds must be >= 0, got {deadline}")
        changed = await self._change(
            "admin_drain", request,
            lambda address, pool: self._ops.drain(address, pool, deadline), deadline_s=deadline)
        return pb.DrainEndpointResponse(endpoint=changed)

    @_mapped
    async def UndrainEndpoint(
        self, request: pb.UndrainEndpointRequest, context: Context
    ) -> pb.UndrainEndpointResponse:
        changed = await self._change("admin_undrain", request, self._ops.undrain)
        return pb.UndrainEndpointResponse(endpoint=changed)

    @_mapped
    async def FailEndpoint(
        self, request: pb.FailEndpointRequest, context: Context
    ) -> pb.FailEndpointResponse:
        changed = await self._change("admin_fail", request, self._ops.fail)
        return pb.FailEndpointResponse(endpoint=changed)

    async def _change(
        self, event: str, request: Message,
        change: Callable[[str, str | None], Awaitable[EndpointRecord]], **fields: object,
    ) -> pb.Endpoint:
        """An operator's change to the endpoint `request` names: made, logged as `event`,
        answered as the endpoint's new record."""
        record = await change(_address(request), _optional(request, "pool"))
        log.info(event, pool=record.pool, endpoint=record.address, **fields)
        return endpoint(record)

    @_mapped
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        page = await self._ops.list_sessions(
            _optional(request, "pool"), _optional(request, "endpoint"), request.limit,
            _optional(request, "after"),
        )
        return pb.ListSessionsResponse(sessions=[session_binding(b) for b in page.sessions],
                                       next_after=page.next_after)

    @_mapped
    async def ShowSession(
        self, request: pb.ShowSessionRequest, context: Context
    ) -> pb.ShowSessionResponse:
        if not request.session.strip():
            raise BadRequest("session is required")
        found = await self._ops.show_session(request.session)
        return pb.ShowSessionResponse(bindings=[session_binding(b) for b in found])

    @_mapped
    async def MoveSession(
        self, request: pb.MoveSessionRequest, context: Context
    ) -> pb.MoveSessionResponse:
        if not request.session.strip():
            raise BadRequest("session is required")
        if not request.endpoint.strip():
            raise BadRequest("endpoint is required")
        moved = await self._ops.move_session(
            request.session, request.endpoint.strip(), _optional(request, "pool")
        )
        log.info("admin_move_session", session=moved.binding.session, pool=moved.binding.pool,
                 endpoint=moved.binding.endpoint)
        return pb.MoveSessionResponse(binding=session_binding(moved))

    @_mapped
    async def Status(
        self, request: pb.StatusRequest, context: Context
    ) -> pb.StatusResponse:
        status = self._status()
        response = control_plane_status(status)
        try:
            found = await self._ops.list_endpoints()
        except EtcdError as exc:
            # The control plane's own view (Envoys, versions, tasks) is still worth showing.
            response.endpoints_error = str(exc)
        else:
            response.endpoints.extend(endpoint_status(s) for s in found.endpoints)
            if found.sessions_note is not None:
                response.sessions_note = found.sessions_note
        try:
            response.etcd_alarms.extend(await self._ops.etcd_alarms())
            response.etcd_db_bytes, response.etcd_db_in_use_bytes = await self._ops.etcd_db()
            reports = await self._ops.ext_proc_reports()
        except EtcdError:
            pass  # already named in endpoints_error or etcd_errors
        else:
            fresh = [r for r in reports if time.time() - r.at <= REPORT_TTL]
            response.ext_procs.extend(ext_proc_status(r) for r in fresh)
            response.mirrors.extend(mirror_status(f"ext_proc {r.identity}", m)
                                    for r in fresh for m in r.mirrors)
        return response

    async def WatchFleetLoad(
        self, request: pb.WatchFleetLoadRequest,
        context: grpc.aio.ServicerContext[pb.WatchFleetLoadRequest, pb.FleetLoad],
    ) -> AsyncIterator[pb.FleetLoad]:
        if self._fleet is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this control plane runs no fleet-state collector")
            return
        async for frame in self._fleet.watch(context):
            yield frame


def _optional(request: Message, name: str) -> str | None:
    """An optional string field: unset or blank → None (the CLI sends blanks as unset anyway)."""
    if not request.HasField(name):
        return None
    value = str(getattr(request, name)).strip()
    return value or None


def _address(request: object) -> str:
    address = str(getattr(request, "address", "")).strip()
    if not address:
        raise BadRequest("address is required (ip:port)")
    return address


# -- dataclasses → protos ------------------------------------------------------------------------


def endpoint(record: EndpointRecord) -> pb.Endpoint:
    message = pb.Endpoint(
        pool=record.pool, address=record.address, kv_pool=record.kv_pool, weight=record.weight,
        admin=record.admin, healthy=record.healthy, state=record.state, role=record.role,
    )
    if record.drain_deadline is not None:
        message.drain_deadline = record.drain_deadline
    message.source = record.source
    if record.left_at is not None:
        message.left_at = record.left_at
    return message


def endpoint_status(status: EndpointStatus) -> pb.EndpointStatus:
    load = pb.Load()
    for name in ("running", "waiting", "kv_cache_usage", "hit_rate", "backlog_s"):
        value = getattr(status.load, name)
        if value is not None:
            setattr(load, name, value)
    message = pb.EndpointStatus(endpoint=endpoint(status.record), sessions=status.sessions,
                                load=load, held=status.probes.held)
    if status.probes.failing:  # the health checks' word, whatever the guard made of it
        message.endpoint.healthy = False
    return message


def session_binding(found: SessionBinding) -> pb.SessionBinding:
    b = found.binding
    message = pb.SessionBinding(session=b.session, pool=b.pool, endpoint=b.endpoint,
                                revision=b.revision, lease=found.lease)
    if b.move_reason is not None:
        message.moved_at = b.moved_at
        message.move_reason = str(b.move_reason)
    if b.estimate is not None:
        message.move_terms.update(dict(b.estimate.terms))
        message.stay_s = b.estimate.stay_s
    turn = found.last_turn
    if turn is not None:
        message.last_turn.CopyFrom(pb.PdTurn(
            path=turn.path, decode=turn.decode, prefill=turn.prefill or "",
            lacking_tokens=turn.lacking_tokens, at=turn.at))
    return message


def mirror_status(replica: str, mirror: MirrorStatus) -> pb.MirrorStatus:
    message = pb.MirrorStatus(replica=replica, name=mirror.name, state=str(mirror.state),
                              since=mirror.since, revision=mirror.revision,
                              relists=mirror.relists)
    if mirror.error is not None:
        message.error = mirror.error
    return message


def ext_proc_status(report: ReplicaReport) -> pb.ExtProcStatus:
    message = pb.ExtProcStatus(identity=report.identity, reported_at=report.at,
                               bindings=report.bindings, pending=report.pending,
                               degraded=report.degraded, unbound=report.unbound,
                               load_source=report.load_source,
                               collector_reachable=report.collector_reachable)
    if report.load_age_s is not None:
        message.load_age_s = report.load_age_s
    return message


def collector_status(status: CollectorStatus) -> pb.FleetCollectorStatus:
    return pb.FleetCollectorStatus(collecting=status.collecting, engines=status.engines,
                                   watchers=status.watchers, interval_s=status.interval_s,
                                   rounds=status.rounds)


def node_status(node: NodeStatus) -> pb.NodeStatus:
    message = pb.NodeStatus(node_id=node.node_id, cluster=node.cluster,
                            connected_at=node.connected_at, acked=node.acked, nacks=node.nacks)
    if node.last_nack is not None:
        message.last_nack = node.last_nack
    if node.last_nack_version is not None:
        message.last_nack_version = node.last_nack_version
    return message


def control_plane_status(status: ControlPlaneStatus) -> pb.StatusResponse:
    message = pb.StatusResponse(
        identity=status.identity, config_version=status.config_version,
        config_source=status.config_source, nodes=[node_status(n) for n in status.nodes],
    )
    if status.leader is not None:
        message.leader = status.leader
    if status.last_reload_error is not None:
        message.last_reload_error = status.last_reload_error
    message.failing_tasks.extend(
        pb.TaskFailure(task=f.task, restarts=f.restarts, error=f.error, failed_at=f.failed_at)
        for f in status.failing_tasks
    )
    message.etcd_errors.extend(
        pb.EtcdErrorSeen(kind=e.kind, count=e.count, error=e.error, last_at=e.last_at)
        for e in status.etcd_errors
    )
    message.membership_generation = status.membership_generation
    message.mirrors.extend(mirror_status(f"control_plane {status.identity}", m)
                           for m in status.mirrors)
    if status.membership_warning is not None:
        message.membership_warning = status.membership_warning
    if status.fleet_collector is not None:
        message.fleet_collector.CopyFrom(collector_status(status.fleet_collector))
    message.discovery.extend(discovery_source(v) for v in status.discovery)
    return message


def discovery_source(view: SourceView) -> pb.DiscoverySource:
    message = pb.DiscoverySource(pool=view.pool, source=view.source, engines=view.engines,
                                 error=view.error)
    if view.age_s is not None:
        message.age_seconds = view.age_s
    return message
