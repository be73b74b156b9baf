"""`control_plane:` where the control plane listens."""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.config.address import HostPort
from kvgate.config.schema import Address, key


@dataclass(frozen=True, slots=True)
class ControlPlane:
    xds: HostPort = key(Address(), "the control plane's xDS (ADS) listener",
                        default=HostPort("127.0.0.1", 18000))
    admin: HostPort = key(Address(), "the control plane's admin gRPC API (`kvgate endpoints/"
                          "sessions/status`)", default=HostPort("127.0.0.1", 18001))
