"""The validated configuration: immutable values, defaults in one place."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Health:
    path: str = "/health"
    interval: float = 2.0
    timeout: float = 1.0
    unhealthy_threshold: int = 3
    healthy_threshold: int = 2


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: HostPort
    kv_pool: str
    weight: int = 1

    @property
    def key(self) -> str:
        """The `ip:port` form Envoy uses for the host and for override_host."""
        return str(self.address)


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    kv_pool: str
    endpoints: tuple[Endpoint, ...]
    health: Health = field(default_factory=Health)


@dataclass(frozen=True, slots=True)
class RouteMatch:
    prefix: str = "/"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    match: RouteMatch
    pool: str
    timeout: float = 0.0


@dataclass(frozen=True, slots=True)
class Etcd:
    endpoints: tuple[HostPort, ...] | None = None  # None: `kvgate up` starts an embedded etcd
    prefix: str = "/kvgate/v1/"


@dataclass(frozen=True, slots=True)
class Session:
    headers: tuple[str, ...] = ("x-session-id",)
    idle_ttl: float = 3600.0


@dataclass(frozen=True, slots=True)
class Placement:
    load_factor: float = 1.25


@dataclass(frozen=True, slots=True)
class ExtProc:
    # Envoy balances over every address listed; `kvgate ext-proc` listens on the first by default.
    addresses: tuple[HostPort, ...] = (HostPort("127.0.0.1", 9002),)
    metrics: HostPort = HostPort("127.0.0.1", 9003)
    message_timeout: float = 0.2


@dataclass(frozen=True, slots=True)
class ControlPlane:
    xds: HostPort = HostPort("127.0.0.1", 18000)
    admin: HostPort = HostPort("127.0.0.1", 18001)


@dataclass(frozen=True, slots=True)
class Config:
    listener: HostPort = HostPort("127.0.0.1", 8080)
    envoy_admin: HostPort = HostPort("127.0.0.1", 9901)
    control_plane: ControlPlane = field(default_factory=ControlPlane)
    ext_proc: ExtProc = field(default_factory=ExtProc)
    etcd: Etcd = field(default_factory=Etcd)
    session: Session = field(default_factory=Session)
    placement: Placement = field(default_factory=Placement)
    pools: tuple[Pool, ...] = ()
    routes: tuple[Route, ...] = ()
    # Response header naming the engine (`ip:port`) that served the request; None = off,
    # the default, since it reveals internal addresses to clients.
    upstream_header: str | None = None

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)
