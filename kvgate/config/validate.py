"""Checks across fields (duplicates, collisions, routes to unknown pools) and warnings about
exposure; each problem at the field path it concerns."""

from __future__ import annotations

import ipaddress

from kvgate.config.errors import PathPart
from kvgate.config.fields import Fields
from kvgate.config.model import Config
from kvgate.config.sections.pools import Pool
from kvgate.contract.states import Role


def validate(f: Fields, config: Config, *, require_pools: bool) -> None:
    """Checks across fields. Runs even when fields had problems (every problem in one run), but
    skips values that were replaced by a default because of one."""
    seen_pools: dict[str, int] = {}
    seen_endpoints: dict[str, tuple[PathPart, ...]] = {}
    if require_pools and not config.pools and not f.failed(("pools",)):
        f.error(("pools",), "at least one pool with endpoints is required (only `kvgate up` "
                "runs without pools: it starts an emulated fleet)")
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
        _check_roles(f, config, pool, i)
        health_path = ("pools", i, "health")
        if pool.health.timeout > pool.health.interval and not f.failed(health_path):
            f.error((*health_path, "timeout"), "must not exceed health.interval")
    # A route to a pool whose name had a problem is not a second problem.
    unnamed = any(len(p.path) == 3 and p.path[0] == "pools" and p.path[2] == "name"
                  for p in f.problems)
    for i, route in enumerate(config.routes):
        if route.pool not in seen_pools and not unnamed:
            known = ", ".join(seen_pools) or "none defined"
            f.error(("routes", i, "pool"), f"unknown pool {route.pool!r} (pools: {known})")
    if len(config.pools) > 1 and not config.routes and not f.failed(("routes",)):
        f.error(("routes",), "required when more than one pool is defined")
    _check_ports(f, config)
    _check_exposure(f, config)
    _check_collector(f, config)
    _check_kv_event_streams(f, config)
    _check_prompt_reads(f, config)


def _check_roles(f: Fields, config: Config, pool: Pool, i: int) -> None:
    """A prefill engine hands its KV to a decode engine of its pool: a pool of prefill
    engines alone answers nothing."""
    roles = [ep.role for ep in pool.endpoints]
    if Role.PREFILL not in roles:
        return
    first = roles.index(Role.PREFILL)
    if not any(r.decodes for r in roles):
        f.error(("pools", i, "endpoints"), f"pool {pool.name!r} has prefill engines "
                f"(first at endpoints[{first}]) but no engine that decodes: give at least "
                "one endpoint role `decode` (or `both`)")
    if config.ext_proc.transport != "grpc":
        f.error(("pools", i, "endpoints", first, "role"), "prefill engines need "
                "ext_proc.transport grpc: the two-stage wire reads the body over ext_proc's "
                "gRPC stream")


def _check_ports(f: Fields, config: Config) -> None:
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
        path = _dotted(name)
        if f.failed(path if not name.startswith("ext_proc.address") else ("ext_proc", "address")):
            continue  # a default stands in for a value with a problem: no collision to report
        key = (address.host, address.port)
        if key in owners:
            f.error(path, f"{address} is already used by {owners[key]}")
        owners.setdefault(key, name)


def _dotted(name: str) -> tuple[PathPart, ...]:
    parts: list[PathPart] = []
    for part in name.split("."):
        field, _, index = part.partition("[")
        parts.append(field)
        if index:
            parts.append(int(index.rstrip("]")))
    return tuple(parts)


_EXPOSURE = {
    "envoy_admin": "Envoy's admin interface lets whoever reaches it read every setting, "
    "change log levels, drain listeners or stop Envoy",
    "control_plane.admin": "the admin API drains, fails and moves engines' sessions (off "
    "loopback it needs a token; give it TLS too)",
    "control_plane.xds": "the xDS port is plain gRPC without authentication: whoever reaches "
    "it reads the gateway's routes and engine addresses",
}


def _check_exposure(f: Fields, config: Config) -> None:
    """Warnings, not errors: containers and Kubernetes need these off loopback, behind a
    network policy; on a shared host they are usually a mistake."""
    addresses = {
        "envoy_admin": config.envoy_admin,
        "control_plane.admin": config.control_plane.admin,
        "control_plane.xds": config.control_plane.xds,
    }
    for name, address in addresses.items():
        path = _dotted(name)
        if f.failed(path) or _is_loopback(address.host):
            continue
        where = (*path, "address") if name == "envoy_admin" else path
        f.warn(where, f"{address.host} is not loopback: {_EXPOSURE[name]}; keep it on "
               "127.0.0.1, or reachable only from where it must be")
    etcd = config.etcd
    if etcd.auth is not None and etcd.tls is None and not f.failed(("etcd",)) and any(
        not _is_loopback(e.host) for e in etcd.endpoints or ()
    ):
        f.warn(("etcd", "auth"), "without etcd.tls the etcd password and every binding cross "
               "the network in clear; give etcd.tls too")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _check_collector(f: Fields, config: Config) -> None:
    """`load_gate.source: collector` with no address of its own asks `control_plane.admin`: a
    wildcard there is where the control plane listens, not where a replica can reach it."""
    gate, admin = config.placement.load_gate, config.control_plane.admin
    path = ("placement", "load_gate", "collector")
    if (gate.feed == "collector" and not gate.collector
            and not f.failed(path) and admin.host.strip("[]") in ("0.0.0.0", "::")):
        f.warn(path, f"empty, so ext_proc replicas ask control_plane.admin ({admin}) for the "
               "engines' load: a wildcard address there reaches each replica's own host, not "
               "the control plane; name the control planes' admin addresses here")


def _check_kv_event_streams(f: Fields, config: Config) -> None:
    """`load_gate.kv_events_port` puts every engine's publisher at that port on its host: two
    engines on one host would be read from one stream, each credited with the other's blocks.
    A warning, since the gate still works without events: the collector follows none of those
    streams (kvgate.fleet.collector.one_stream_each)."""
    gate = config.placement.load_gate
    path = ("placement", "load_gate", "kv_events_port")
    if not gate.kv_events_port or f.failed(path):
        return
    by_host: dict[str, list[str]] = {}
    for pool in config.pools:
        for endpoint in pool.endpoints:
            by_host.setdefault(endpoint.address.host, []).append(endpoint.key)
    for host, engines in by_host.items():
        if len(set(engines)) > 1:
            f.warn(path, f"engines {', '.join(sorted(set(engines)))} share host {host}: all "
                   f"would be read from one stream, tcp://{host}:{gate.kv_events_port}, so the "
                   "collector reads none of them; give each its own with kv_events_port_offset "
                   "(its port plus the offset)")


def _check_prompt_reads(f: Fields, config: Config) -> None:
    """The prefix step reads request bodies over ext_proc's gRPC stream (ext_proc.prompt_stream);
    over HTTP it sees none, and places as without it. A warning: the gateway still works."""
    path = ("placement", "load_gate", "prefix_placement")
    if config.placement.load_gate.reads_prompts and config.ext_proc.transport != "grpc":
        f.warn(path, "ext_proc over HTTP reads no request body, so the prefix step sees no "
               "prompt and places as without it: use ext_proc.transport grpc")
