"""The kinds of a config key's value: how each is read (problems recorded in Fields, at the key's
path), bounded, dumped back to YAML and described in the reference. Sections declare their keys
with them (kvgate.config.schema.key); a nested section is kvgate.config.schema.Section.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvgate.config.address import HostPort
from kvgate.config.fields import Fields, Path

Reader = Callable[[Fields, Any, Path], Any]


class Kind:
    """How one key's value is read (problems recorded in Fields), dumped and described."""

    accepts = ""  # for the reference: what the YAML may say

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value

    def show(self, value: Any) -> str:
        """The default, as the reference shows it."""
        return f"`{yaml_scalar(self.dump(value))}`"


def yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"[{', '.join(yaml_scalar(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Integer(Kind):
    low: int
    high: int

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        return f.integer(value, path, self.low, self.high)

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return f"integer {self.low:,}..{self.high:,}"


@dataclass(frozen=True)
class Number(Kind):
    low: float
    high: float

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        return f.number(value, path, self.low, self.high)

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return f"number {self.low:g}..{self.high:g}"


@dataclass(frozen=True)
class Scaled(Kind):
    """A number the YAML gives in another unit than the field holds (`transfer_fixed_ms` for
    `transfer_fixed_s`): field = YAML ÷ `per`. The dump finds the YAML number that reads back
    as exactly the field's value."""

    low: float
    high: float
    per: float
    unit: str

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        number = f.number(value, path, self.low, self.high)
        return None if number is None else number / self.per

    def dump(self, value: Any) -> Any:
        guess = value * self.per
        for candidate in _neighbours(guess):
            if candidate / self.per == value:
                return candidate
        return guess

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return f"number {self.low:g}..{self.high:g} ({self.unit})"


def _neighbours(value: float, steps: int = 4) -> Iterator[float]:
    yield value
    up = down = value
    for _ in range(steps):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        yield up
        yield down


_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001))


@dataclass(frozen=True)
class Duration(Kind):
    low: float
    high: float

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        return f.duration(value, path, self.low, self.high)

    def dump(self, value: Any) -> Any:
        """The shortest unit form that reads back exactly; else plain seconds (exact)."""
        if value == 0:
            return "0s"
        for unit, seconds in _UNITS:
            count = value / seconds
            if count.is_integer() and count < 1e12 and int(count) * seconds == value:
                return f"{int(count)}{unit}"
        return value

    def show(self, value: Any) -> str:
        return f"`{self.dump(value)}`"

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return f"duration {_seconds(self.low)}..{_seconds(self.high)}"


def _seconds(value: float) -> str:
    dumped = Duration(0, 0).dump(value)
    return dumped if isinstance(dumped, str) else f"{value:g}s"


_SIZES = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


@dataclass(frozen=True)
class Size(Kind):
    low: int
    high: int

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        return f.size(value, path, self.low, self.high)

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return f"size {Size(0, 0).show(self.low)[1:-1]}..{Size(0, 0).show(self.high)[1:-1]}"

    def show(self, value: Any) -> str:
        for unit, size in _SIZES:
            if value % size == 0:
                return f"`{value // size}{unit}`"
        return f"`{value}`"


@dataclass(frozen=True)
class Boolean(Kind):
    accepts = "`true` or `false`"

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        if isinstance(value, bool):
            return value
        f.error(path, f"must be true or false, got {value!r}")
        return None


@dataclass(frozen=True)
class OnOff(Kind):
    accepts = "`on` or `off`"

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        # YAML 1.1 reads a bare on/off as a boolean; a quoted "on"/"off" is accepted too.
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("on", "off"):
            return value.lower() == "on"
        f.error(path, f"must be on or off, got {value!r}")
        return None

    def dump(self, value: Any) -> Any:
        return "on" if value else "off"


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        if isinstance(value, str) and value in self.values:
            return value
        f.error(path, f"must be one of {', '.join(self.values)}, got {value!r}")
        return None

    def dump(self, value: Any) -> Any:
        # A StrEnum member (e.g. Role) as its plain word: YAML's safe dumper takes no subclass.
        return str(value) if isinstance(value, str) else value

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return " or ".join(f"`{v}`" for v in self.values)


@dataclass(frozen=True)
class Address(Kind):
    """`host:port` (or `http://host:port`); `ip` when Envoy must use it verbatim."""

    ip: bool = False

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        return f.host_port(value, path, require_ip=self.ip)

    def dump(self, value: Any) -> Any:
        return str(value)

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return "`ip:port`" if self.ip else "`host:port`"


@dataclass(frozen=True)
class Socket(Kind):
    """`{address: ip, port: n}` (address defaults to 127.0.0.1)."""

    accepts = "`{address: ip, port: n}`"

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        raw = f.mapping(value, path, ("address", "port"))
        address = f.optional(raw, "address", path, f.ip, "127.0.0.1")
        if "port" not in raw:
            f.error((*path, "port"), "required")
            return None
        port = f.port(raw["port"], (*path, "port"))
        return None if port is None else HostPort(address, port)

    def dump(self, value: Any) -> Any:
        return {"address": value.host, "port": value.port}

    def show(self, value: Any) -> str:
        return f"`{value}`"


@dataclass(frozen=True)
class Custom(Kind):
    """A key whose reading is its own (a check beyond type and range); dumped as given."""

    reader: Reader
    describe: str
    dumper: Callable[[Any], Any] | None = None

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        return self.reader(f, value, path)

    def dump(self, value: Any) -> Any:
        return value if self.dumper is None else self.dumper(value)

    @property
    def accepts(self) -> str:  # type: ignore[override]
        return self.describe


@dataclass(frozen=True)
class ListOf(Kind):
    """A YAML list of `item`s (read by `reader` when the list has rules of its own)."""

    item: Kind
    reader: Reader | None = None
    accepts = "list"

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        if self.reader is not None:
            return self.reader(f, value, path)
        items = f.sequence(value, path)
        read = (self.item.read(f, item, (*path, i)) for i, item in enumerate(items))
        return tuple(value for value in read if value is not None)

    def dump(self, value: Any) -> Any:
        return [self.item.dump(v) for v in value]

    def show(self, value: Any) -> str:
        return f"`{yaml_scalar(self.dump(value))}`" if value else ""
