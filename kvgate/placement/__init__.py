"""Where a session goes: Envoy's own ring, walked with bounded load."""

from kvgate.placement.pick import fallback_for, place
from kvgate.placement.ring import EnvoyRing, session_hash

__all__ = ["EnvoyRing", "fallback_for", "place", "session_hash"]
