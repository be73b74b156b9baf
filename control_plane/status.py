"""What `kvgate status` shows about the control plane itself and the Envoys it serves."""

from __future__ import annotations

from dataclasses import dataclass, field

from control_plane.discovery import SourceView
from kvgate.etcd.mirror import MirrorStatus
from kvgate.etcd.observed import EtcdErrorSeen
from kvgate.runtime.tasks.supervisor import TaskFailure


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One Envoy (xDS node) connected to this control-plane replica."""

    node_id: str
    cluster: str
    connected_at: float  # unix time
    acked: dict[str, str] = field(default_factory=dict)  # type URL → version Envoy accepted
    nacks: int = 0
    last_nack: str | None = None  # Envoy's error message for the last rejected version
    last_nack_version: str | None = None


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """The fleet-state collector of this replica (`placement.load_gate.source: collector`)."""

    collecting: bool  # leads, and scrapes every active engine each round
    engines: int  # engines it holds figures for
    watchers: int  # ext_proc streams open now
    interval_s: float
    rounds: int  # since it started collecting


@dataclass(frozen=True, slots=True)
class ControlPlaneStatus:
    identity: str  # this replica
    leader: str | None  # the replica holding leadership now (None: none elected)
    config_version: str  # the snapshot version being served
    config_source: str  # the YAML file
    nodes: tuple[NodeStatus, ...] = ()
    last_reload_error: str | None = None
    failing_tasks: tuple[TaskFailure, ...] = ()  # background tasks failing and being restarted
    etcd_errors: tuple[EtcdErrorSeen, ...] = ()  # by kind, seen in the last 5 minutes
    membership_generation: int = 0  # of the endpoint membership etcd holds (0: none yet)
    membership_warning: str | None = None  # this replica's file is not etcd's membership
    mirrors: tuple[MirrorStatus, ...] = ()  # this replica's etcd mirrors
    fleet_collector: CollectorStatus | None = None  # None: the load gate uses no collector
    discovery: tuple[SourceView, ...] = ()  # pools[].discover's sources, with their answers' age
