"""The simulator's `--gate-*` flags, one per key of `placement.load_gate` that changes a decision
(kvgate.config.sections.placement.DECISION_KEYS): named, bounded, defaulted and described by the
config's schema, so a key is written once, there. A flag takes what the YAML takes (`1.5`,
`1500ms`, `on`, `prefill,queue_wait`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import yaml

from kvgate.config.fields import Fields
from kvgate.config.schema import Entry, ListOf, yaml_scalar
from kvgate.config.sections.placement import DECISION_KEYS, GateConfig

PREFIX = "gate_"


def _flag(entry: Entry) -> str:
    return "--gate-" + entry.name.replace("_", "-")


def _reader(entry: Entry) -> Callable[[str], Any]:
    """The flag's text read as the YAML's value is: a clear error naming the flag if not."""
    kind = entry.key.kind

    def read(text: str) -> Any:
        value: Any = ([item.strip() for item in text.split(",") if item.strip()]
                      if isinstance(kind, ListOf) else yaml.safe_load(text))
        fields = Fields()
        read_value = kind.read(fields, value, ())
        if fields.problems:
            raise argparse.ArgumentTypeError(fields.problems[0].message)
        return read_value

    return read


def add_gate_flags(parser: argparse.ArgumentParser) -> None:
    defaults = GateConfig()
    for entry in DECISION_KEYS:
        default = getattr(defaults, entry.attr)
        parser.add_argument(
            _flag(entry), type=_reader(entry), default=default, dest=PREFIX + entry.attr,
            metavar=entry.name.upper(),
            help=f"placement.load_gate.{entry.name}: {entry.key.doc} "
                 f"({yaml_scalar(entry.key.kind.dump(default))})".replace("%", "%%"))


def gate_settings(args: argparse.Namespace) -> GateConfig:
    """The gate the flags describe (every other key at its default)."""
    return GateConfig(**{e.attr: getattr(args, PREFIX + e.attr) for e in DECISION_KEYS})


def gate_description(gate: GateConfig) -> dict[str, Any]:
    """The decision keys, for a result's JSON: the terms and the prefix step's keys only when
    not their defaults, so results from before those keys read as they did."""
    described = {e.attr: getattr(gate, e.attr) for e in DECISION_KEYS}
    defaults = GateConfig()
    for name in ("terms", "prefix_placement", "prefix_index_blocks"):
        if described[name] == getattr(defaults, name):
            del described[name]
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in described.items()}
