"""Command-line overrides of config values, shared by the service commands."""

from __future__ import annotations

import sys

from kvgate.config.errors import ConfigError
from kvgate.config.fields import Fields
from kvgate.config.load import load_file
from kvgate.config.model import Config, HostPort


def address_flag(
    fields: Fields, text: str | None, flag: str, default: HostPort | None
) -> HostPort | None:
    """`--flag HOST:PORT` if given (problems recorded in `fields`), else the config's value."""
    return fields.host_port(text, (flag,), require_ip=False) if text else default


def etcd_flag(text: str | None, config: Config) -> tuple[str, ...]:
    """`--etcd a,b` if given, else the config's `etcd.endpoints` (possibly none)."""
    given = tuple(e.strip() for e in (text or "").split(",") if e.strip())
    return given or tuple(str(e) for e in config.etcd.endpoints or ())


def load_or_report(path: str) -> Config | None:
    """The config at `path`, or None after printing every problem to stderr."""
    try:
        return load_file(path)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return None
