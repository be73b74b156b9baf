"""Endpoint states, as etcd's endpoint records, ext_proc, the control plane, the admin API and
the simulator name them. String-valued: the records' JSON and the API's fields hold these words."""

from __future__ import annotations

from enum import StrEnum


class EndpointState(StrEnum):
    ACTIVE = "active"  # takes new sessions
    DRAINING = "draining"  # keeps its sessions (until a deadline), takes no new ones
    FAILED = "failed"  # its sessions move now; Envoy is told it is unhealthy
