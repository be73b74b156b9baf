"""Endpoint membership and states (active, draining, failed), shared through etcd."""

from kvgate.endpoints.directory import EndpointDirectory
from kvgate.endpoints.records import EndpointRecord, seed_from_config

__all__ = ["EndpointDirectory", "EndpointRecord", "seed_from_config"]
