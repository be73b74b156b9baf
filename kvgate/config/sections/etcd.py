"""`etcd:` where bindings and endpoint states live, and how kvgate authenticates to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.config.address import HostPort
from kvgate.config.etcd_security import EtcdAuth, EtcdTls, read_auth, read_tls
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Address, Custom, ListOf, Section, key


def _endpoints(f: Fields, value: Any, path: Path) -> tuple[HostPort, ...]:
    items = f.sequence(value, path)
    if isinstance(value, list) and not items:
        f.error(path, "must name at least one etcd endpoint (or be omitted)")
    return tuple(hp for i, v in enumerate(items)
                 if (hp := f.host_port(v, (*path, i), require_ip=False)) is not None)


def _prefix(f: Fields, value: Any, path: Path) -> str | None:
    prefix = f.string(value, path)
    if prefix is not None and not (prefix.startswith("/") and prefix.endswith("/")):
        f.error(path, f"must start and end with '/', got {prefix!r}")
    return prefix


def _tls(f: Fields, value: Any, path: Path) -> EtcdTls | None:
    return read_tls(f, value, path, f.base)


def _auth(f: Fields, value: Any, path: Path) -> EtcdAuth | None:
    return read_auth(f, value, path, f.base)


@dataclass(frozen=True, slots=True)
class Etcd:
    endpoints: tuple[HostPort, ...] | None = key(
        ListOf(Address(), _endpoints), "etcd `host:port` list; omitted under `kvgate up`: an "
        "embedded etcd is started", default=None, default_doc="*(none)*")
    prefix: str = key(Custom(_prefix, "string starting and ending with `/`"),
                      "every key kvgate writes lives under it", default="/kvgate/v1/")
    tls: EtcdTls | None = key(
        Section(EtcdTls, _tls), "TLS to etcd (`{}`: the system's CAs). Relative paths are from "
        "the YAML file's folder; the files are read and checked when the config is (readable, "
        "PEM, key fits certificate)", default=None, default_doc="*(none: plaintext)*")
    auth: EtcdAuth | None = key(Section(EtcdAuth, _auth), "etcd user authentication",
                                default=None, default_doc="*(none)*")
