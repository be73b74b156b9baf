"""The config's one schema: each section's dataclass declares its YAML keys in its fields.

A field made with :func:`key` carries its YAML name, its :class:`Kind` (how a value is read,
bounded, dumped and described) and its meaning. From that alone come the strict reader (unknown
keys refused, every problem at its field path), the dump `kvgate up` hands to the services
(:func:`dump_section`) and the configuration reference (kvgate.config.reference). A section whose
dataclass lives elsewhere (kvgate.placement.cost.EngineCost) is described by :func:`describe`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvgate.config.fields import Fields, Path
from kvgate.config.kinds import (
    Address,
    Boolean,
    Choice,
    Custom,
    Duration,
    Integer,
    Kind,
    ListOf,
    Number,
    OnOff,
    Reader,
    Scaled,
    Size,
    Socket,
    yaml_scalar,
)

# The one import a section declares its keys from: `key`, the kinds (kvgate.config.kinds) and
# Section.
__all__ = [
    "Address", "Boolean", "Choice", "Custom", "Duration", "Entry", "Integer", "Key", "Kind",
    "ListOf", "Number", "OnOff", "Reader", "Scaled", "Section", "Size", "Socket", "describe",
    "dump_section", "entries", "key", "key_names", "read_section", "read_values", "yaml_scalar",
]

_META = "kvgate.config"


@dataclass(frozen=True, slots=True)
class Key:
    kind: Kind
    doc: str
    name: str | None = None  # the YAML key when it differs from the field's name
    default_doc: str | None = None  # the reference's default column, when the value says little


@dataclass(frozen=True, slots=True)
class Entry:
    """One YAML key of a section: its field, name, kind and meaning."""

    attr: str
    name: str
    key: Key


def key(kind: Kind, doc: str, *, default: Any = dataclasses.MISSING,
        factory: Any = dataclasses.MISSING, name: str | None = None,
        default_doc: str | None = None) -> Any:
    """A dataclass field that is a YAML key."""
    meta = {_META: Key(kind, doc, name, default_doc)}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_FOREIGN: dict[type, tuple[Entry, ...]] = {}


def describe(cls: type, **keys: Key) -> None:
    """Declares the YAML keys of a dataclass defined outside the config (field name → Key)."""
    names = [f.name for f in dataclasses.fields(cls)]
    assert sorted(keys) == sorted(names), f"{cls.__name__}: every field is a key"
    _FOREIGN[cls] = tuple(Entry(n, keys[n].name or n, keys[n]) for n in names)


def entries(cls: type) -> tuple[Entry, ...]:
    """The section's keys in declaration order."""
    if cls in _FOREIGN:
        return _FOREIGN[cls]
    return tuple(Entry(f.name, f.metadata[_META].name or f.name, f.metadata[_META])
                 for f in dataclasses.fields(cls) if _META in f.metadata)


def key_names(cls: type) -> tuple[str, ...]:
    return tuple(e.name for e in entries(cls))


def read_values(f: Fields, cls: type, value: Any, path: Path,
                defaults: Any = None) -> dict[str, Any]:
    """The section's fields from a YAML mapping: each key read by its kind, an absent or failed
    one replaced by its default (from `defaults`, else the dataclass's)."""
    raw = f.mapping(value, path, key_names(cls))
    base = cls() if defaults is None else defaults
    values: dict[str, Any] = {}
    for entry in entries(cls):
        values[entry.attr] = f.optional(raw, entry.name, path, _reader(f, entry.key.kind),
                                        getattr(base, entry.attr))
    return values


def _reader(f: Fields, kind: Kind) -> Callable[[Any, Path], Any]:
    def read(value: Any, path: Path) -> Any:
        return kind.read(f, value, path)

    return read


def read_section(f: Fields, cls: type, value: Any, path: Path) -> Any:
    return cls(**read_values(f, cls, value, path))


def dump_section(section: Any) -> dict[str, Any]:
    """The section as YAML data; keys whose value is None (an optional part left out) are
    omitted, so that reading the dump gives them back as None."""
    return {e.name: e.key.kind.dump(getattr(section, e.attr)) for e in entries(type(section))
            if getattr(section, e.attr) is not None}


@dataclass(frozen=True)
class Section(Kind):
    """A nested mapping of keys: the dataclass `cls`, read key by key unless `reader` reads it
    whole (required keys, defaults that depend on the parent), then `check` across its keys."""

    cls: type
    reader: Reader | None = None
    check: Callable[[Fields, Any, Path], None] | None = None
    accepts = "mapping"

    def read(self, f: Fields, value: Any, path: Path) -> Any:
        if self.reader is not None:
            section = self.reader(f, value, path)
        else:
            section = read_section(f, self.cls, value, path)
        if section is not None and self.check is not None:
            self.check(f, section, path)
        return section

    def dump(self, value: Any) -> Any:
        return dump_section(value)

    def show(self, value: Any) -> str:
        return ""

