"""`pools[].discover`: engines found at run time, beside or instead of `endpoints`: the A/AAAA
(or SRV) records of a DNS name, and the lease-bound registrations `kvgate register` keeps in
etcd. Each source says which `kv_pool`, `weight` and `role` its engines get."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from kvgate.config.address import HostPort
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import (
    Custom,
    Duration,
    Integer,
    Section,
    key,
    read_section,
)
from kvgate.config.sections.names import NAME_KIND, ROLE_KIND, matching
from kvgate.contract.states import Role

# Labels of letters, digits and '-', or '_'-led (SRV's `_service._proto`), dot-separated.
_DNS_NAME = re.compile(r"^(?=.{1,253}\.?$)(_?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


_dns_name = matching(_DNS_NAME, "not a valid DNS name")


def _server(f: Fields, value: Any, path: Path) -> HostPort | None:
    text = f.string(value, path)
    if text is None:
        return None
    host, _, port = text.rpartition(":")
    try:
        return HostPort(str(ipaddress.ip_address(host.strip("[]"))), int(port))
    except ValueError:
        f.error(path, f"must be a DNS server's ip:port (an address, since it is what resolves "
                f"names), got {text!r}")
        return None


KV_POOL = NAME_KIND


def is_srv(name: str) -> bool:
    """A name whose first label starts with '_' (`_http._tcp.engines`) is looked up as SRV."""
    return name.startswith("_")


@dataclass(frozen=True, slots=True)
class DnsSource:
    name: str = key(Custom(_dns_name, "DNS name"), "A/AAAA records: one engine each (a "
                    "Kubernetes headless Service, a Compose service); a name starting with `_` "
                    "(`_http._tcp.engines`) is an SRV name and gives the ports too",
                    default="", default_doc="required")
    port: int | None = key(Integer(1, 65535), "the engines' port (A/AAAA names)", default=None,
                           default_doc="required unless SRV")
    every: float = key(Duration(0.1, 3600), "between resolutions", default=5.0)
    server: HostPort | None = key(Custom(_server, "`ip:port`", str), "ask this DNS server "
                                  "instead of the system's resolver", default=None,
                                  default_doc="the system's")
    kv_pool: str | None = key(KV_POOL, "the DDR KV pool its engines share", default=None,
                              default_doc="the pool's `kv_pool`")
    weight: int = key(Integer(1, 128), "each engine's share of the pool's sessions", default=1)
    role: Role = key(ROLE_KIND, "what its engines do", default=Role.BOTH)


@dataclass(frozen=True, slots=True)
class EtcdSource:
    """Registrations under `{etcd.prefix}registrations/{pool}/` (`kvgate register`)."""

    kv_pool: str | None = key(KV_POOL, "the DDR KV pool its engines share", default=None,
                              default_doc="the registration's, else the pool's")
    weight: int | None = key(Integer(1, 128), "each engine's share of the pool's sessions",
                             default=None, default_doc="the registration's, else 1")
    role: Role | None = key(ROLE_KIND, "what its engines do", default=None,
                                  default_doc="the registration's, else `both`")


def _read_dns(f: Fields, value: Any, path: Path) -> DnsSource | None:
    if isinstance(value, dict) and "name" not in value:
        f.error((*path, "name"), "required")
        return None
    source: DnsSource = read_section(f, DnsSource, value, path)
    if source.name and not is_srv(source.name) and source.port is None \
            and not f.failed((*path, "port")):
        f.error((*path, "port"), f"required: {source.name} is looked up as A/AAAA, which "
                "carry no port (an SRV name starts with `_`)")
    return source if source.name else None


@dataclass(frozen=True, slots=True)
class Discover:
    dns: DnsSource | None = key(Section(DnsSource, _read_dns), "engines from a DNS name",
                                default=None, default_doc="*(off)*")
    etcd: EtcdSource | None = key(Section(EtcdSource), "engines that register themselves "
                                  "(`kvgate register`): a lost lease is an engine gone",
                                  default=None, default_doc="*(off)*")
    drain: float = key(Duration(0, 7 * 86400), "an engine that leaves is drained: its sessions "
                       "stay this long (or until idle), then move within its DDR KV pool",
                       default=300.0)
    misses: int = key(Integer(1, 100), "DNS resolutions in a row that must miss an address "
                      "before its engine is drained (a registration's lost lease counts at "
                      "once: its TTL is the hysteresis)", default=3)


def read_discover(f: Fields, value: Any, path: Path) -> Discover | None:
    if value is not None and not isinstance(value, dict):
        f.error(path, "must be a mapping with `dns` and/or `etcd`")
        return None
    discover: Discover = read_section(f, Discover, value, path)
    if discover.dns is None and discover.etcd is None and not f.failed(path):
        f.error(path, "names no source: give `dns: {name, port}` and/or `etcd: {}`")
        return None
    return discover


def source_kv_pool(source: DnsSource | EtcdSource, pool_kv: str) -> str:
    return source.kv_pool or pool_kv


__all__ = ["Discover", "DnsSource", "EtcdSource", "HostPort", "is_srv", "read_discover"]
