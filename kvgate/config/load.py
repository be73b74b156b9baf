"""YAML → Config: strict parse (unknown keys rejected), then cross-field validation.

Every problem is collected with its field path; a file with any problem yields no Config.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path as FilePath
from typing import Any

import yaml

from kvgate.config.errors import ConfigError, PathPart, Problem
from kvgate.config.fields import Fields, Path
from kvgate.config.model import (
    Config,
    ControlPlane,
    Endpoint,
    Etcd,
    ExtProc,
    Health,
    HostPort,
    Placement,
    Pool,
    Route,
    RouteMatch,
    Session,
)
from kvgate.contract.envoy import DESTINATION_KEY

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
TOP_LEVEL = (
    "listener", "envoy_admin", "control_plane", "ext_proc", "etcd",
    "session", "placement", "pools", "routes", "upstream_header",
)


def load_file(path: str | FilePath) -> Config:
    file = FilePath(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem((), f"cannot read file: {exc}")], str(file)) from None
    return load_text(text, source=str(file))


def load_text(text: str, source: str = "") -> Config:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError([Problem((), f"not valid YAML: {exc}", line)], source) from None
    fields = Fields()
    config = _config(fields, raw)
    if not fields.problems:
        _validate(fields, config)
    if fields.problems:
        problems = [Problem(p.path, p.message, _line_of(root, p.path)) for p in fields.problems]
        raise ConfigError(problems, source)
    return with_default_routes(config)


def _config(f: Fields, raw: Any) -> Config:
    top = f.mapping(raw, (), TOP_LEVEL)
    defaults = Config()
    return Config(
        listener=f.optional(top, "listener", (), lambda v, p: _socket(f, v, p), defaults.listener),
        envoy_admin=f.optional(
            top, "envoy_admin", (), lambda v, p: _socket(f, v, p), defaults.envoy_admin
        ),
        control_plane=f.optional(
            top, "control_plane", (), lambda v, p: _control_plane(f, v, p), defaults.control_plane
        ),
        ext_proc=f.optional(
            top, "ext_proc", (), lambda v, p: _ext_proc(f, v, p), defaults.ext_proc
        ),
        etcd=f.optional(top, "etcd", (), lambda v, p: _etcd(f, v, p), defaults.etcd),
        session=f.optional(top, "session", (), lambda v, p: _session(f, v, p), defaults.session),
        placement=f.optional(
            top, "placement", (), lambda v, p: _placement(f, v, p), defaults.placement
        ),
        pools=tuple(
            pool
            for i, item in enumerate(f.sequence(top.get("pools"), ("pools",)))
            if (pool := _pool(f, item, ("pools", i))) is not None
        ),
        routes=tuple(
            route
            for i, item in enumerate(f.sequence(top.get("routes"), ("routes",)))
            if (route := _route(f, item, ("routes", i))) is not None
        ),
        upstream_header=_upstream_header(f, top.get("upstream_header")),
    )


def _upstream_header(f: Fields, value: Any) -> str | None:
    """Off when absent, null or empty; else a plain header name of Envoy's to set."""
    if value is None or value == "":
        return None
    name = f.header_name(value, ("upstream_header",))
    if name is not None and (name.startswith(":") or name == DESTINATION_KEY):
        f.error(("upstream_header",), f"{name!r} cannot name the upstream")
        return None
    return name


def _socket(f: Fields, value: Any, path: Path) -> HostPort | None:
    raw = f.mapping(value, path, ("address", "port"))
    address = f.optional(raw, "address", path, f.ip, "127.0.0.1")
    if "port" not in raw:
        f.error((*path, "port"), "required")
        return None
    port = f.port(raw["port"], (*path, "port"))
    return None if port is None else HostPort(address, port)


def _control_plane(f: Fields, value: Any, path: Path) -> ControlPlane:
    raw = f.mapping(value, path, ("xds", "admin"))
    d = ControlPlane()

    def read(v: Any, p: Path) -> HostPort | None:
        return f.host_port(v, p, require_ip=False)

    return ControlPlane(
        xds=f.optional(raw, "xds", path, read, d.xds),
        admin=f.optional(raw, "admin", path, read, d.admin),
    )


def _ext_proc(f: Fields, value: Any, path: Path) -> ExtProc:
    raw = f.mapping(value, path, ("address", "metrics", "message_timeout"))
    d = ExtProc()
    addresses = d.addresses
    if raw.get("address") is not None:
        items = raw["address"] if isinstance(raw["address"], list) else [raw["address"]]
        item_path = (*path, "address")
        parsed = [
            f.host_port(v, (*item_path, i) if isinstance(raw["address"], list) else item_path,
                        require_ip=True)
            for i, v in enumerate(items)
        ]
        if not items:
            f.error(item_path, "must name at least one address")
        addresses = tuple(a for a in parsed if a is not None) or d.addresses
    return ExtProc(
        addresses=addresses,
        metrics=f.optional(
            raw, "metrics", path, lambda v, p: f.host_port(v, p, require_ip=False), d.metrics
        ),
        message_timeout=f.optional(
            raw, "message_timeout", path, lambda v, p: f.duration(v, p, 0.01, 10.0),
            d.message_timeout,
        ),
    )


def _etcd(f: Fields, value: Any, path: Path) -> Etcd:
    raw = f.mapping(value, path, ("endpoints", "prefix"))
    endpoints: tuple[HostPort, ...] | None = None
    if raw.get("endpoints") is not None:
        items = f.sequence(raw["endpoints"], (*path, "endpoints"))
        if isinstance(raw["endpoints"], list) and not items:
            f.error((*path, "endpoints"), "must name at least one etcd endpoint (or be omitted)")
        endpoints = tuple(
            hp
            for i, v in enumerate(items)
            if (hp := f.host_port(v, (*path, "endpoints", i), require_ip=False)) is not None
        )
    prefix = f.optional(raw, "prefix", path, f.string, Etcd().prefix)
    if not (prefix.startswith("/") and prefix.endswith("/")):
        f.error((*path, "prefix"), f"must start and end with '/', got {prefix!r}")
    return Etcd(endpoints=endpoints, prefix=prefix)


def _session(f: Fields, value: Any, path: Path) -> Session:
    raw = f.mapping(value, path, ("headers", "idle_ttl"))
    d = Session()
    headers = d.headers
    if raw.get("headers") is not None:
        items = f.sequence(raw["headers"], (*path, "headers"))
        names = [f.header_name(v, (*path, "headers", i)) for i, v in enumerate(items)]
        for i, name in enumerate(names):
            if name is not None and (name.startswith(":") or name == DESTINATION_KEY):
                f.error((*path, "headers", i), f"{name!r} cannot carry a session id")
        if isinstance(raw["headers"], list) and not items:
            f.error((*path, "headers"), "must name at least one header")
        headers = tuple(dict.fromkeys(n for n in names if n)) or d.headers
    return Session(
        headers=headers,
        idle_ttl=f.optional(
            raw, "idle_ttl", path, lambda v, p: f.duration(v, p, 2.0, 30 * 86400.0), d.idle_ttl
        ),
    )


def _placement(f: Fields, value: Any, path: Path) -> Placement:
    raw = f.mapping(value, path, ("load_factor",))
    return Placement(
        load_factor=f.optional(
            raw, "load_factor", path, lambda v, p: f.number(v, p, 1.0, 100.0),
            Placement().load_factor,
        )
    )


def _health(f: Fields, value: Any, path: Path) -> Health:
    raw = f.mapping(
        value, path,
        ("path", "interval", "timeout", "unhealthy_threshold", "healthy_threshold"),
    )
    d = Health()
    health = Health(
        path=f.optional(raw, "path", path, f.string, d.path),
        interval=f.optional(raw, "interval", path, lambda v, p: f.duration(v, p, 0.05, 3600),
                            d.interval),
        timeout=f.optional(raw, "timeout", path, lambda v, p: f.duration(v, p, 0.01, 600),
                           d.timeout),
        unhealthy_threshold=f.optional(raw, "unhealthy_threshold", path,
                                       lambda v, p: f.integer(v, p, 1, 100), d.unhealthy_threshold),
        healthy_threshold=f.optional(raw, "healthy_threshold", path,
                                     lambda v, p: f.integer(v, p, 1, 100), d.healthy_threshold),
    )
    if not health.path.startswith("/"):
        f.error((*path, "path"), f"must start with '/', got {health.path!r}")
    return health


def _pool(f: Fields, value: Any, path: Path) -> Pool | None:
    raw = f.mapping(value, path, ("name", "kv_pool", "endpoints", "health"))
    if "name" not in raw:
        f.error((*path, "name"), "required")
        return None
    name = _name(f, raw["name"], (*path, "name"))
    kv_pool = f.optional(raw, "kv_pool", path, lambda v, p: _name(f, v, p), name or "")
    items = f.sequence(raw.get("endpoints"), (*path, "endpoints"))
    if not items:
        f.error((*path, "endpoints"), "required: at least one endpoint")
    endpoints = tuple(
        ep
        for i, item in enumerate(items)
        if (ep := _endpoint(f, item, (*path, "endpoints", i), kv_pool)) is not None
    )
    health = f.optional(raw, "health", path, lambda v, p: _health(f, v, p), Health())
    if name is None:
        return None
    return Pool(name=name, kv_pool=kv_pool, endpoints=endpoints, health=health)


def _endpoint(f: Fields, value: Any, path: Path, pool_kv: str) -> Endpoint | None:
    if isinstance(value, str):
        address = f.host_port(value, path, require_ip=True)
        return None if address is None else Endpoint(address, pool_kv)
    raw = f.mapping(value, path, ("address", "kv_pool", "weight"))
    if "address" not in raw:
        if isinstance(value, dict):
            f.error((*path, "address"), "required")
        return None
    address = f.host_port(raw["address"], (*path, "address"), require_ip=True)
    kv_pool = f.optional(raw, "kv_pool", path, lambda v, p: _name(f, v, p), pool_kv)
    weight = f.optional(raw, "weight", path, lambda v, p: f.integer(v, p, 1, 128), 1)
    return None if address is None else Endpoint(address, kv_pool, weight)


def _route(f: Fields, value: Any, path: Path) -> Route | None:
    raw = f.mapping(value, path, ("match", "pool", "timeout"))
    match_raw = f.mapping(raw.get("match"), (*path, "match"), ("prefix", "headers"))
    prefix = f.optional(match_raw, "prefix", (*path, "match"), f.string, "/")
    if not prefix.startswith("/"):
        f.error((*path, "match", "prefix"), f"must start with '/', got {prefix!r}")
    headers_path: tuple[PathPart, ...] = (*path, "match", "headers")
    headers_raw = match_raw.get("headers") or {}
    headers: list[tuple[str, str]] = []
    if not isinstance(headers_raw, dict):
        f.error(headers_path, "must be a mapping of header name to value")
    else:
        for key, val in headers_raw.items():
            name = f.header_name(key, (*headers_path, str(key)))
            text = val if isinstance(val, str) else None
            if text is None:
                f.error((*headers_path, str(key)), f"value must be a string, got {val!r}")
            if name is not None and text is not None:
                headers.append((name, text))
    if "pool" not in raw:
        f.error((*path, "pool"), "required")
        return None
    pool = f.string(raw["pool"], (*path, "pool"))
    timeout = f.optional(raw, "timeout", path, lambda v, p: f.duration(v, p, 0.0, 86400.0), 0.0)
    if pool is None:
        return None
    return Route(RouteMatch(prefix, tuple(headers)), pool, timeout)


def _name(f: Fields, value: Any, path: Path) -> str | None:
    text = f.string(value, path)
    if text is not None and not _NAME.fullmatch(text):
        f.error(path, f"must be lower-case letters, digits, '-', '_' or '.', got {text!r}")
        return None
    return text


def _validate(f: Fields, config: Config) -> None:
    seen_pools: dict[str, int] = {}
    seen_endpoints: dict[str, tuple[PathPart, ...]] = {}
    for i, pool in enumerate(config.pools):
        if pool.name in seen_pools:
            f.error(("pools", i, "name"), f"duplicate pool name {pool.name!r} "
                    f"(first at pools[{seen_pools[pool.name]}])")
        seen_pools.setdefault(pool.name, i)
        for j, endpoint in enumerate(pool.endpoints):
            where = ("pools", i, "endpoints", j)
            if endpoint.key in seen_endpoints:
                first = seen_endpoints[endpoint.key]
                f.error(where, f"endpoint {endpoint.key} listed twice (first at "
                        f"pools[{first[1]}].endpoints[{first[3]}])")
            seen_endpoints.setdefault(endpoint.key, where)
        if pool.health.timeout > pool.health.interval:
            f.error(("pools", i, "health", "timeout"), "must not exceed health.interval")
    for i, route in enumerate(config.routes):
        if route.pool not in seen_pools:
            known = ", ".join(seen_pools) or "none defined"
            f.error(("routes", i, "pool"), f"unknown pool {route.pool!r} (pools: {known})")
    if config.pools and not config.routes and len(config.pools) > 1:
        f.error(("routes",), "required when more than one pool is defined")
    ports = {
        "listener": config.listener,
        "envoy_admin": config.envoy_admin,
        "control_plane.xds": config.control_plane.xds,
        "control_plane.admin": config.control_plane.admin,
        "ext_proc.metrics": config.ext_proc.metrics,
    }
    for i, address in enumerate(config.ext_proc.addresses):
        ports[f"ext_proc.address[{i}]"] = address
    owners: dict[tuple[str, int], str] = {}
    for name, address in ports.items():
        key = (address.host, address.port)
        if key in owners:
            f.error(tuple(name.split(".")), f"{address} is already used by {owners[key]}")
        owners.setdefault(key, name)


def with_default_routes(config: Config) -> Config:
    """A config with one pool and no routes sends everything to that pool."""
    if config.routes or len(config.pools) != 1:
        return config
    return replace(config, routes=(Route(RouteMatch("/"), config.pools[0].name),))


def _line_of(root: yaml.Node | None, path: tuple[PathPart, ...]) -> int | None:
    node = root
    line = None if root is None else root.start_mark.line + 1
    for part in path:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == part:
                    child = value_node
                    line = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                child = node.value[part]
                line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
