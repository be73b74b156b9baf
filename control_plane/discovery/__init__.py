"""Discovery as the control plane runs it (`pools[].discover`): sources resolved by every
replica, their engines written to etcd's endpoint records by the leader."""

from control_plane.discovery.service import Discovery, SourceView, with_discovered

__all__ = ["Discovery", "SourceView", "with_discovered"]
