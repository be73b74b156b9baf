"""The validated configuration: immutable values, each section's keys declared once in its
dataclass (kvgate.config.sections, kvgate.config.schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.config.address import HostPort
from kvgate.config.etcd_security import EtcdAuth, EtcdTls
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Custom, Section, Size, Socket, key
from kvgate.config.sections.control_plane import ControlPlane
from kvgate.config.sections.disaggregation import Disaggregation
from kvgate.config.sections.etcd import Etcd
from kvgate.config.sections.ext_proc import ExtProc
from kvgate.config.sections.placement import GateConfig, Placement
from kvgate.config.sections.pools import POOLS, Endpoint, Health, Pool
from kvgate.config.sections.routes import (
    INFERENCE_PATHS,
    INFERENCE_PREFIXES,
    ROUTES,
    Route,
    RouteMatch,
    inference_routes,
)
from kvgate.config.sections.session import Session
from kvgate.contract.envoy import DESTINATION_KEY

__all__ = [
    "INFERENCE_PATHS", "INFERENCE_PREFIXES", "Config", "ControlPlane", "Endpoint", "Etcd",
    "EtcdAuth", "EtcdTls", "ExtProc", "GateConfig", "Health", "HostPort", "Placement", "Pool",
    "Route", "RouteMatch", "Session", "inference_routes",
]


def _upstream_header(f: Fields, value: Any, path: Path) -> str | None:
    """Off when empty; else a plain header name of Envoy's to set."""
    if value == "":
        return None
    name = f.header_name(value, path)
    if name is not None and (name.startswith(":") or name == DESTINATION_KEY):
        f.error(path, f"{name!r} cannot name the upstream")
        return None
    return name


@dataclass(frozen=True, slots=True)
class Config:
    listener: HostPort = key(Socket(), "the gateway users call",
                             default=HostPort("127.0.0.1", 8080))
    envoy_admin: HostPort = key(Socket(), "Envoy's admin interface (keep it on loopback)",
                                default=HostPort("127.0.0.1", 9901))
    control_plane: ControlPlane = key(Section(ControlPlane), "where the control plane listens",
                                      factory=ControlPlane)
    ext_proc: ExtProc = key(Section(ExtProc), "the decision service", factory=ExtProc)
    etcd: Etcd = key(Section(Etcd), "bindings and endpoint states", factory=Etcd)
    session: Session = key(Section(Session), "where session ids come from", factory=Session)
    placement: Placement = key(Section(Placement), "where sessions go", factory=Placement)
    disaggregation: Disaggregation = key(
        Section(Disaggregation), "prefill/decode pools: when a turn is prefilled elsewhere",
        factory=Disaggregation)
    pools: tuple[Pool, ...] = key(POOLS, "the engines", default=(), default_doc="required")
    routes: tuple[Route, ...] = key(ROUTES, "which paths go to which pool (listed routes "
                                    "replace the default list entirely; required with several "
                                    "pools)", default=(), default_doc="the inference API")
    # Response header naming the engine (`ip:port`) that served the request; None = off,
    # the default, since it reveals internal addresses to clients.
    upstream_header: str | None = key(
        Custom(_upstream_header, "header name"), "a response header (e.g. `x-kvgate-upstream`) "
        "that Envoy sets to the `ip:port` of the engine that served the request, whatever the "
        "engine; replaces any value the engine sent. Off by default: it tells clients internal "
        "addresses", default=None, default_doc="*(off)*")
    max_request_bytes: int = key(
        Size(64 * 1024, 2 * 1024**3), "the largest request body the gateway accepts, sized or "
        "chunked: a larger one is answered 413 (an OpenAI-style JSON error) before ext_proc or "
        "an engine sees it. Envoy holds each body whole before passing it on",
        default=32 * 1024 * 1024)

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)
