"""YAML → Config: strict parse (unknown keys rejected), then cross-field validation.

Every problem is collected with its field path; a file with any problem yields no Config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path as FilePath
from typing import Any

import yaml

from kvgate.config.errors import ConfigError, PathPart, Problem
from kvgate.config.etcd_security import read_auth, read_tls
from kvgate.config.fields import Fields, Path
from kvgate.config.model import (
    Config,
    ControlPlane,
    Endpoint,
    Etcd,
    ExtProc,
    Health,
    HostPort,
    Pool,
    Route,
    RouteMatch,
    Session,
    inference_routes,
)
from kvgate.config.placement import read_placement
from kvgate.config.read import READ_WAIT, read_text
from kvgate.config.strict_yaml import YamlProblem, parse
from kvgate.config.validate import validate
from kvgate.contract.envoy import DESTINATION_KEY

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
MIN_MESSAGE_TIMEOUT = 0.05
_BODY_FIELD = re.compile(r"[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64})*")
TOP_LEVEL = (
    "listener", "envoy_admin", "control_plane", "ext_proc", "etcd",
    "session", "placement", "pools", "routes", "upstream_header",
)


@dataclass(frozen=True, slots=True)
class Checked:
    """A usable config and what is allowed in it but probably unwise (each with its line)."""

    config: Config
    warnings: tuple[Problem, ...] = ()


def load_file(path: str | FilePath, *, require_pools: bool = True) -> Config:
    return check_file(path, require_pools=require_pools).config


def load_text(
    text: str, source: str = "", *, require_pools: bool = True, base: FilePath | None = None
) -> Config:
    return check_text(text, source, require_pools=require_pools, base=base).config


def check_file(
    path: str | FilePath, *, require_pools: bool = True, wait: float = READ_WAIT
) -> Checked:
    """The file at `path`, read with a size cap and a deadline (pipes, FIFOs, devices)."""
    return check_text(read_text(path, wait=wait), str(path), require_pools=require_pools,
                      base=FilePath(path).absolute().parent)


def check_text(
    text: str, source: str = "", *, require_pools: bool = True, base: FilePath | None = None
) -> Checked:
    """Parses and validates; raises ConfigError with every problem, field-level and across
    fields, each with its line. `require_pools=False` for `kvgate up`, which then runs an
    emulated fleet. Relative file names (etcd.tls, etcd.auth) are taken from `base` (the YAML
    file's folder; default: the current one)."""
    try:
        root, raw, duplicates = parse(text)
    except YamlProblem as exc:
        raise ConfigError([exc.problem], source) from None
    fields = Fields()
    if root is None:
        fields.error((), "the file is empty: a kvgate config needs at least `pools:` "
                     "(see examples/kvgate.yaml)")
        config = Config()
    else:
        config = _config(fields, raw, base or FilePath.cwd())
        validate(fields, config, require_pools=require_pools)
    problems = duplicates + [_located(root, p) for p in fields.problems]
    if problems:
        raise ConfigError(sorted(problems, key=lambda p: p.line or 0), source)
    warnings = tuple(_located(root, w) for w in fields.warnings)
    return Checked(with_default_routes(config), warnings)


def _located(root: yaml.Node | None, problem: Problem) -> Problem:
    return Problem(problem.path, problem.message, _line_of(root, problem.path) or 1)


def _config(f: Fields, raw: Any, base: FilePath) -> Config:
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
        etcd=f.optional(top, "etcd", (), lambda v, p: _etcd(f, v, p, base), defaults.etcd),
        session=f.optional(top, "session", (), lambda v, p: _session(f, v, p), defaults.session),
        placement=f.optional(
            top, "placement", (), lambda v, p: read_placement(f, v, p), defaults.placement
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
    raw = f.mapping(value, path, ("address", "metrics", "message_timeout", "transport",
                                  "max_pending_bindings"))
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
            raw, "message_timeout", path, lambda v, p: _message_timeout(f, v, p),
            d.message_timeout,
        ),
        transport=f.optional(raw, "transport", path, lambda v, p: _transport(f, v, p),
                             d.transport),
        max_pending_bindings=f.optional(
            raw, "max_pending_bindings", path, lambda v, p: f.integer(v, p, 1, 10_000_000),
            d.max_pending_bindings,
        ),
    )


EXT_PROC_TRANSPORTS = ("grpc", "http")


def _transport(f: Fields, value: Any, path: Path) -> str | None:
    if isinstance(value, str) and value in EXT_PROC_TRANSPORTS:
        return value
    f.error(path, f"must be one of {', '.join(EXT_PROC_TRANSPORTS)}, got {value!r}")
    return None


def _message_timeout(f: Fields, value: Any, path: Path) -> float | None:
    seconds = f.duration(value, path, 0.0, 10.0)
    if seconds is not None and seconds < MIN_MESSAGE_TIMEOUT:
        # A new session's etcd write gets half of it (ExtProc.etcd_write_deadline).
        f.error(path, f"must be at least {MIN_MESSAGE_TIMEOUT * 1000:g}ms, got {value!r}: a new "
                "session's etcd write gets half of it, and etcd (an fsync per write) would "
                "routinely miss a shorter deadline, leaving every new binding queued")
        return None
    return seconds


def _etcd(f: Fields, value: Any, path: Path, base: FilePath) -> Etcd:
    raw = f.mapping(value, path, ("endpoints", "prefix", "tls", "auth"))
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
    return Etcd(
        endpoints=endpoints, prefix=prefix,
        tls=f.optional(raw, "tls", path, lambda v, p: read_tls(f, v, p, base), None),
        auth=f.optional(raw, "auth", path, lambda v, p: read_auth(f, v, p, base), None),
    )


def _session(f: Fields, value: Any, path: Path) -> Session:
    raw = f.mapping(value, path, ("headers", "idle_ttl", "body_fields", "implicit", "body_limit",
                                  "max_bindings"))
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
    body_fields = d.body_fields
    if raw.get("body_fields") is not None:
        items = f.sequence(raw["body_fields"], (*path, "body_fields"))
        fields = [_body_field(f, v, (*path, "body_fields", i)) for i, v in enumerate(items)]
        body_fields = tuple(dict.fromkeys(name for name in fields if name))  # [] reads no field
    return Session(
        headers=headers,
        idle_ttl=f.optional(
            raw, "idle_ttl", path, lambda v, p: f.duration(v, p, 2.0, 30 * 86400.0), d.idle_ttl
        ),
        body_fields=body_fields,
        implicit=f.optional(raw, "implicit", path, lambda v, p: _on_off(f, v, p), d.implicit),
        body_limit=f.optional(
            raw, "body_limit", path, lambda v, p: f.size(v, p, 1024, 64 * 1024 * 1024),
            d.body_limit,
        ),
        max_bindings=f.optional(
            raw, "max_bindings", path, lambda v, p: f.integer(v, p, 0, 1_000_000_000),
            d.max_bindings,
        ),
    )


def _body_field(f: Fields, value: Any, path: Path) -> str | None:
    """A dotted path into the JSON body: object keys only (Envoy's json_to_metadata selectors)."""
    text = f.string(value, path)
    if text is None:
        return None
    if not _BODY_FIELD.fullmatch(text) or text.count(".") >= 8:
        f.error(path, f"must be a JSON field or a dotted path of at most 8 fields "
                f"(letters, digits, '_', '-'), such as metadata.session_id; got {text!r}")
        return None
    return text


def _on_off(f: Fields, value: Any, path: Path) -> bool | None:
    # YAML 1.1 reads a bare on/off as a boolean; a quoted "on"/"off" is accepted too.
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("on", "off"):
        return value.lower() == "on"
    f.error(path, f"must be on or off, got {value!r}")
    return None


def _health(f: Fields, value: Any, path: Path) -> Health:
    raw = f.mapping(
        value, path,
        ("path", "interval", "timeout", "unhealthy_threshold", "healthy_threshold",
         "max_failed_fraction"),
    )
    d = Health()
    health = Health(
        path=f.optional(raw, "path", path, lambda v, p: f.http_path(v, p, query=True), d.path),
        interval=f.optional(raw, "interval", path, lambda v, p: f.duration(v, p, 0.05, 3600),
                            d.interval),
        timeout=f.optional(raw, "timeout", path, lambda v, p: f.duration(v, p, 0.01, 600),
                           d.timeout),
        unhealthy_threshold=f.optional(raw, "unhealthy_threshold", path,
                                       lambda v, p: f.integer(v, p, 1, 100), d.unhealthy_threshold),
        healthy_threshold=f.optional(raw, "healthy_threshold", path,
                                     lambda v, p: f.integer(v, p, 1, 100), d.healthy_threshold),
        max_failed_fraction=f.optional(raw, "max_failed_fraction", path,
                                       lambda v, p: f.number(v, p, 0.0, 1.0),
                                       d.max_failed_fraction),
    )
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
    match_path: tuple[PathPart, ...] = (*path, "match")
    match_raw = f.mapping(raw.get("match"), match_path, ("prefix", "path", "headers"))

    def read_path(v: Any, p: Path) -> str | None:
        return f.http_path(v, p, query=False)

    prefix = f.optional(match_raw, "prefix", match_path, read_path, "/")
    exact = f.optional(match_raw, "path", match_path, read_path, None)
    if "prefix" in match_raw and "path" in match_raw:
        f.error((*match_path, "path"), "give either prefix or path, not both")
    headers_path: tuple[PathPart, ...] = (*match_path, "headers")
    headers_raw = match_raw.get("headers") or {}
    headers: list[tuple[str, str]] = []
    if not isinstance(headers_raw, dict):
        f.error(headers_path, "must be a mapping of header name to value")
    else:
        for key, val in headers_raw.items():
            name = f.header_name(key, (*headers_path, str(key)))
            text = f.string(val, (*headers_path, str(key)))
            if name is not None and text is not None:
                headers.append((name, text))
    if "pool" not in raw:
        f.error((*path, "pool"), "required")
        return None
    pool = f.string(raw["pool"], (*path, "pool"))
    timeout = f.optional(raw, "timeout", path, lambda v, p: f.duration(v, p, 0.0, 86400.0), 0.0)
    if pool is None:
        return None
    return Route(RouteMatch(prefix, tuple(headers), exact), pool, timeout)


def _name(f: Fields, value: Any, path: Path) -> str | None:
    text = f.string(value, path)
    if text is not None and not _NAME.fullmatch(text):
        f.error(path, f"must be lower-case letters, digits, '-', '_' or '.', got {text!r}")
        return None
    return text


def with_default_routes(config: Config) -> Config:
    """A config with one pool and no routes serves the inference API from that pool, and
    nothing else (model.INFERENCE_PATHS)."""
    if config.routes or len(config.pools) != 1:
        return config
    return replace(config, routes=inference_routes(config.pools[0].name))


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
