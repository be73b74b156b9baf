"""xDS over ADS, layered like go-control-plane: resources (pure builders, `resources/`) →
snapshot cache (`cache.py`: versions, consistency, no gRPC) → server (`server.py`: the stream)."""

from control_plane.resources.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, TYPE_ORDER
from control_plane.xds.cache import InconsistentSnapshot, Snapshot, SnapshotCache

__all__ = [
    "CLUSTER", "ENDPOINT", "LISTENER", "ROUTE", "TYPE_ORDER",
    "InconsistentSnapshot", "Snapshot", "SnapshotCache",
]
