"""Endpoint membership and states (active, draining, failed), shared through etcd."""

from kvgate.endpoints.directory import EndpointDirectory
from kvgate.endpoints.membership import (
    MembershipConflict,
    MembershipState,
    MembershipWatch,
    membership_digest,
    sync_membership,
)
from kvgate.endpoints.records import EndpointRecord
from kvgate.endpoints.store import EndpointRecords, UnknownEndpoint

__all__ = [
    "EndpointDirectory", "EndpointRecord", "EndpointRecords", "MembershipConflict",
    "MembershipState", "MembershipWatch", "UnknownEndpoint", "membership_digest",
    "sync_membership",
]
