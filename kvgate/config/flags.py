"""Command-line overrides of config values, shared by the service commands."""

from __future__ import annotations

import sys
from dataclasses import replace

from kvgate.config.errors import ConfigError, Problem
from kvgate.config.fields import Fields
from kvgate.config.load import check_file, with_default_routes
from kvgate.config.model import Config, Endpoint, HostPort, Pool


def address_flag(
    fields: Fields, text: str | None, flag: str, default: HostPort | None
) -> HostPort | None:
    """`--flag HOST:PORT` if given (problems recorded in `fields`), else the config's value."""
    return fields.host_port(text, (flag,), require_ip=False) if text else default


def flags_refused(fields: Fields) -> bool:
    """True, after printing them to stderr, if the flags read into `fields` had problems."""
    if fields.problems:
        print("\n".join(str(p) for p in fields.problems), file=sys.stderr)
    return bool(fields.problems)


def etcd_flag(text: str | None, config: Config) -> tuple[str, ...]:
    """`--etcd a,b` if given, else the config's `etcd.endpoints` (possibly none)."""
    given = tuple(e.strip() for e in (text or "").split(",") if e.strip())
    return given or tuple(str(e) for e in config.etcd.endpoints or ())


def with_engines(config: Config, engines: str) -> Config:
    """The config fronting `engines` (`--engines`: URLs or ip:port, comma separated) as its one
    pool, serving the default routes. Problems name the flag and the URL, not a YAML line."""
    fields = Fields()
    items = [e.strip() for e in engines.split(",") if e.strip()]
    endpoints: dict[str, Endpoint] = {}
    for item in items:
        address = fields.host_port(item, ("--engines",), require_ip=True)
        if address is None:
            continue
        endpoint = Endpoint(address, "default")
        if endpoint.key in endpoints:
            fields.error(("--engines",), f"engine {endpoint.key} given twice ({item!r})")
        endpoints[endpoint.key] = endpoint
    if not items:
        fields.error(("--engines",), "no engine given (e.g. --engines http://10.0.0.11:8000)")
    if fields.problems:
        raise ConfigError(fields.problems)
    pool = Pool(name="default", kv_pool="default", endpoints=tuple(endpoints.values()))
    return with_default_routes(replace(config, pools=(pool,), routes=()))


def load_or_report(path: str, *, require_pools: bool = True) -> Config | None:
    """The config at `path` (its warnings printed to stderr), or None after printing every
    problem to stderr."""
    try:
        checked = check_file(path, require_pools=require_pools)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return None
    report_warnings(path, checked.warnings)
    return checked.config


def report_warnings(path: str, warnings: tuple[Problem, ...]) -> None:
    for warning in warnings:
        print(f"{path}: warning: {warning}", file=sys.stderr)
