"""Strict readers for YAML values: each records a Problem at its path instead of raising."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Any, TypeVar

from kvgate.config.address import HostPort
from kvgate.config.errors import PathPart, Problem

T = TypeVar("T")
Path = tuple[PathPart, ...]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB)?")
_UNIT_BYTES = {None: 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
# C0 controls and DEL: CR/LF in a path or header value would split an HTTP request.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class Fields:
    """Collects problems while reading; callers check `problems` once at the end."""

    def __init__(self, base: FilePath | None = None) -> None:
        self.base = base or FilePath.cwd()  # relative file names in values are from here
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def error(self, path: Path, message: str) -> None:
        self.problems.append(Problem(path, message))

    def warn(self, path: Path, message: str) -> None:
        """Allowed, but probably not what the user wants: reported, never refused."""
        self.warnings.append(Problem(path, message))

    def failed(self, path: Path) -> bool:
        """Whether a problem was recorded at `path` or below it (its value is a default now, so
        checks across fields skip it rather than report a consequence as a second problem)."""
        return any(p.path[: len(path)] == path for p in self.problems)

    def mapping(self, value: Any, path: Path, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"must be a mapping, got {_kind(value)}")
            return {}
        for key in value:
            if key not in allowed:
                self.error(
                    (*path, str(key)),
                    f"unknown key (allowed here: {', '.join(allowed)})",
                )
        return {k: v for k, v in value.items() if k in allowed}

    def sequence(self, value: Any, path: Path) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(path, f"must be a list, got {_kind(value)}")
            return []
        return value

    def optional(
        self, raw: dict[str, Any], key: str, path: Path, read: Callable[[Any, Path], T | None],
        default: T,
    ) -> T:
        if key not in raw or raw[key] is None:
            return default
        result = read(raw[key], (*path, key))
        return default if result is None else result

    def string(self, value: Any, path: Path) -> str | None:
        if not isinstance(value, str) or not value:
            self.error(path, f"must be a non-empty string, got {_kind(value)}")
            return None
        control = _CONTROL.search(value)
        if control is not None:
            self.error(path, f"must not contain control characters, found {control.group()!r} "
                       f"at position {control.start()} of {_show(value)}")
            return None
        return value

    def http_path(self, value: Any, path: Path, *, query: bool) -> str | None:
        """An absolute request path as sent on the wire: no spaces; a query only if `query`."""
        text = self.string(value, path)
        if text is None:
            return None
        if not text.startswith("/"):
            self.error(path, f"must start with '/', got {_show(text)}")
            return None
        bad = " \t#" if query else " \t#?"
        if any(c in bad for c in text):
            what = ("spaces or '#'" if query
                    else "spaces, '?' or '#' (a route matches the path only)")
            self.error(path, f"must not contain {what}, got {_show(text)}")
            return None
        return text

    def integer(self, value: Any, path: Path, low: int, high: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"must be an integer, got {_kind(value)}")
            return None
        if not low <= value <= high:
            self.error(path, f"must be {low}..{high}, got {value}")
            return None
        return value

    def number(self, value: Any, path: Path, low: float, high: float) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(path, f"must be a number, got {_kind(value)}")
            return None
        if not low <= value <= high:
            self.error(path, f"must be between {low} and {high}, got {value}")
            return None
        return float(value)

    def duration(self, value: Any, path: Path, low: float, high: float) -> float | None:
        """Accepts `250ms`, `2s`, `1h30m`, or a plain number of seconds."""
        seconds: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value) if abs(value) < 1e300 else float("inf")
        elif isinstance(value, str):
            parts = _DURATION.findall(value)
            if parts and "".join(n + u for n, u in parts) == value:
                seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        if seconds is None:
            self.error(path, f"must be a duration like 500ms, 2s, 5m or 1h, got {_show(value)}")
            return None
        if not low <= seconds <= high:
            self.error(path, f"must be between {_fmt(low)} and {_fmt(high)}, got {_show(value)}")
            return None
        return seconds

    def size(self, value: Any, path: Path, low: int, high: int) -> int | None:
        """Accepts `512KiB`, `4MiB`, `1GiB`, or a plain number of bytes."""
        size: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
            size = int(match[1]) * _UNIT_BYTES[match[2]]
        if size is None:
            self.error(path, f"must be a size like 512KiB, 4MiB or a number of bytes, "
                       f"got {value!r}")
            return None
        if not low <= size <= high:
            self.error(path, f"must be between {low} and {high} bytes, got {value!r}")
            return None
        return size

    def ip(self, value: Any, path: Path) -> str | None:
        text = self.string(value, path)
        if text is None:
            return None
        try:
            return str(ipaddress.ip_address(text.strip("[]")))
        except ValueError:
            self.error(
                path,
                f"must be an IP address (Envoy does not resolve names here), got {_show(text)}",
            )
            return None

    def port(self, value: Any, path: Path) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"port must be an integer, got {_kind(value)}")
            return None
        if not 1 <= value <= 65535:
            self.error(path, f"port must be 1..65535, got {value}")
            return None
        return value

    def host_port(self, value: Any, path: Path, *, require_ip: bool) -> HostPort | None:
        """Reads `host:port`, `[v6]:port` or `http://host:port`; `require_ip` for addresses
        Envoy must use verbatim. Any other scheme is an error: kvgate would connect without TLS
        to an address written as `https://`, so it refuses it rather than pretend."""
        text = self.string(value, path)
        if text is None:
            return None
        scheme = _SCHEME.match(text)
        if scheme is not None:
            if scheme.group(1).lower() != "http":
                self.error(path, f"{scheme.group(1)}:// is not supported: kvgate connects to "
                           f"this address in plain text, without TLS; write host:port or "
                           f"http://host:port, got {_show(value)}")
                return None
            text = text[scheme.end():]
        text = text.removesuffix("/")
        if "/" in text:
            self.error(path, f"must be host:port, without a path, got {_show(value)}")
            return None
        host, sep, port_text = text.rpartition(":")
        if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
            self.error(path, f"must be host:port, got {_show(value)}")
            return None
        port = int(port_text) if len(port_text) <= 5 else 0
        if not 1 <= port <= 65535:
            shown = port_text if len(port_text) <= 12 else f"{port_text[:12]}..."
            self.error(path, f"port must be 1..65535, got {shown}")
            return None
        host = host.strip("[]")
        if require_ip:
            try:
                host = str(ipaddress.ip_address(host))
            except ValueError:
                hint = " (write 127.0.0.1)" if host == "localhost" else ""
                self.error(
                    path, f"must be an IP address and port (Envoy does not resolve names "
                    f"here{hint}), got {_show(value)}"
                )
                return None
        elif not _HOST.fullmatch(host) and not _is_ip(host):
            self.error(path, f"not a valid host name or IP address: {_show(host)}")
            return None
        return HostPort(host, port)

    def header_name(self, value: Any, path: Path) -> str | None:
        text = self.string(value, path)
        if text is None:
            return None
        name = text.lower()
        if not _HEADER_NAME.fullmatch(name):
            self.error(path, f"not a valid HTTP header name: {_show(text)}")
            return None
        return name


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {_show(value)}"


def _show(value: Any, limit: int = 60) -> str:
    """repr, shortened: a problem names the value without echoing a megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _fmt(seconds: float) -> str:
    return f"{seconds:g}s"
