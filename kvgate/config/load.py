"""YAML → Config: strict parse by the schema (unknown keys rejected), then cross-field validation.

Every problem is collected with its field path; a file with any problem yields no Config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path as FilePath

import yaml

from kvgate.config.errors import ConfigError, PathPart, Problem
from kvgate.config.fields import Fields
from kvgate.config.model import Config, inference_routes
from kvgate.config.read import READ_WAIT, read_text
from kvgate.config.schema import key_names, read_section
from kvgate.config.strict_yaml import YamlProblem, parse
from kvgate.config.validate import validate

TOP_LEVEL = key_names(Config)


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
    fields = Fields(base)
    if root is None:
        fields.error((), "the file is empty: a kvgate config needs at least `pools:` "
                     "(see examples/kvgate.yaml)")
        config = Config()
    else:
        config = read_section(fields, Config, raw, ())
        validate(fields, config, require_pools=require_pools)
    problems = duplicates + [_located(root, p) for p in fields.problems]
    if problems:
        raise ConfigError(sorted(problems, key=lambda p: p.line or 0), source)
    warnings = tuple(_located(root, w) for w in fields.warnings)
    return Checked(with_default_routes(config), warnings)


def _located(root: yaml.Node | None, problem: Problem) -> Problem:
    return Problem(problem.path, problem.message, _line_of(root, problem.path) or 1)


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
