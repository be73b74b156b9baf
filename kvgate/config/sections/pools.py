"""`pools:` the engines, grouped by the DDR KV pool they share, and how they are probed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.config.address import HostPort
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import (
    Address,
    Custom,
    Duration,
    Integer,
    ListOf,
    Number,
    Section,
    key,
    key_names,
    read_section,
)
from kvgate.config.sections.discover import Discover, read_discover
from kvgate.config.sections.names import NAME_KIND, ROLE_KIND, name, role
from kvgate.contract.states import Role

_NAME_KIND = NAME_KIND


def _health_path(f: Fields, value: Any, path: Path) -> str | None:
    return f.http_path(value, path, query=True)


@dataclass(frozen=True, slots=True)
class Health:
    path: str = key(Custom(_health_path, "request path"), "the probe's path", default="/health")
    interval: float = key(Duration(0.05, 3600), "between probes", default=2.0)
    timeout: float = key(Duration(0.01, 600), "a probe's deadline (at most `interval`)",
                         default=1.0)
    unhealthy_threshold: int = key(Integer(1, 100), "failed probes in a row that mark an "
                                   "engine failed", default=3)
    healthy_threshold: int = key(Integer(1, 100), "passed probes in a row that bring it back",
                                 default=2)
    # Probes never mark more than this share of a pool failed (Envoy's max_ejection_percent):
    # past it, an engine they call dead keeps routing, since the prober is more likely wrong.
    max_failed_fraction: float = key(
        Number(0.0, 1.0), "probes never mark more than this share of the pool failed at once: "
        "past it, the prober is more likely wrong than the engines", default=0.5)


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: HostPort = key(Address(ip=True), "IP literals only: Envoy uses them verbatim",
                            default_doc="required")
    kv_pool: str = key(_NAME_KIND, "the DDR KV pool this engine shares",
                       default_doc="the pool's `kv_pool`")
    weight: int = key(Integer(1, 128), "its share of the pool's sessions, relative", default=1)
    role: Role = key(ROLE_KIND, "`both`: colocated; `prefill`: prefills turns a decode engine "
                     "then answers (vLLM's kv_transfer_params); `decode`: holds sessions",
                     default=Role.BOTH)

    @property
    def key(self) -> str:
        """The `ip:port` form Envoy uses for the host and for override_host."""
        return str(self.address)


def _endpoint(f: Fields, value: Any, path: Path, pool_kv: str) -> Endpoint | None:
    if isinstance(value, str):
        address = f.host_port(value, path, require_ip=True)
        return None if address is None else Endpoint(address, pool_kv)
    raw = f.mapping(value, path, key_names(Endpoint))
    if "address" not in raw:
        if isinstance(value, dict):
            f.error((*path, "address"), "required")
        return None
    address = f.host_port(raw["address"], (*path, "address"), require_ip=True)
    kv_pool = f.optional(raw, "kv_pool", path, lambda v, p: name(f, v, p), pool_kv)
    weight = f.optional(raw, "weight", path, lambda v, p: f.integer(v, p, 1, 128), 1)
    endpoint_role = f.optional(raw, "role", path, lambda v, p: role(f, v, p), Role.BOTH)
    return None if address is None else Endpoint(address, kv_pool, weight, endpoint_role)


def _read_pool(f: Fields, value: Any, path: Path) -> Pool | None:
    raw = f.mapping(value, path, key_names(Pool))
    if "name" not in raw:
        f.error((*path, "name"), "required")
        return None
    pool_name = name(f, raw["name"], (*path, "name"))
    kv_pool = f.optional(raw, "kv_pool", path, lambda v, p: name(f, v, p), pool_name or "")
    items = f.sequence(raw.get("endpoints"), (*path, "endpoints"))
    discover = f.optional(raw, "discover", path, lambda v, p: read_discover(f, v, p), None)
    if not items and discover is None and not f.failed((*path, "discover")):
        f.error((*path, "endpoints"), "required: at least one endpoint (or `discover:`)")
    endpoints = tuple(
        ep
        for i, item in enumerate(items)
        if (ep := _endpoint(f, item, (*path, "endpoints", i), kv_pool)) is not None
    )
    health = f.optional(raw, "health", path,
                        lambda v, p: read_section(f, Health, v, p), Health())
    if pool_name is None:
        return None
    return Pool(name=pool_name, kv_pool=kv_pool, endpoints=endpoints, health=health,
                discover=discover)


@dataclass(frozen=True, slots=True)
class Pool:
    name: str = key(_NAME_KIND, "the pool (one Envoy cluster `kvgate_pool_<name>`)",
                    default_doc="required")
    kv_pool: str = key(_NAME_KIND, "the DDR KV pool its engines share; the default for its "
                       "endpoints", default_doc="the pool's name")
    endpoints: tuple[Endpoint, ...] = key(
        ListOf(Section(Endpoint)), "`ip:port` (or `http://ip:port`), or `{address, kv_pool, "
        "weight, role}`", default=(), default_doc="required unless `discover`")
    health: Health = key(Section(Health), "how the control plane probes its engines",
                         factory=Health)
    discover: Discover | None = key(Section(Discover, read_discover), "engines found while "
                                    "running, beside or instead of `endpoints`", default=None,
                                    default_doc="*(off)*")

    @property
    def disaggregated(self) -> bool:
        """It has prefill engines: its turns take the two-stage wire (kvgate.pd)."""
        return any(ep.role is Role.PREFILL for ep in self.endpoints)


def read_pools(f: Fields, value: Any, path: Path) -> tuple[Pool, ...]:
    return tuple(pool for i, item in enumerate(f.sequence(value, path))
                 if (pool := _read_pool(f, item, (*path, i))) is not None)


POOLS = ListOf(Section(Pool, _read_pool), read_pools)
