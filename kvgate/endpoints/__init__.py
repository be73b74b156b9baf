"""Endpoint membership and states (active, draining, failed), shared through etcd."""

from kvgate.endpoints.directory import EndpointDirectory
from kvgate.endpoints.records import EndpointRecord, seed_from_config
from kvgate.endpoints.store import EndpointRecords, UnknownEndpoint

__all__ = [
    "EndpointDirectory", "EndpointRecord", "EndpointRecords", "UnknownEndpoint",
    "seed_from_config",
]
