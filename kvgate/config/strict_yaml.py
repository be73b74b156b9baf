"""YAML for configs, strictly: bounded nesting, duplicate keys found (with both lines), and every
parse failure a Problem with its line, never a traceback."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvgate.config.errors import PathPart, Problem

MAX_DEPTH = 32  # a kvgate config nests 5 levels; PyYAML's recursion fails near 1,000
_MERGE = "tag:yaml.org,2002:merge"


class YamlProblem(Exception):
    """The text is not YAML a config can be read from."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting before Python's stack does, and turns a value the
    constructor cannot build (a 5,000-digit number, month 13) into a marked error."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self._depth >= MAX_DEPTH:
            event = self.peek_event()  # type: ignore[no-untyped-call]  # unannotated in its stub
            raise ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, OverflowError, TypeError) as exc:
            shown = node.value if isinstance(node, ScalarNode) else node.tag
            raise ConstructorError(
                None, None, f"cannot read the value {str(shown)[:40]!r}: {exc}", node.start_mark
            ) from None


def parse(text: str) -> tuple[Node | None, Any, list[Problem]]:
    """(node tree, plain data, duplicate-key problems), or YamlProblem. The node tree gives
    every later problem its line."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks every character first
        root = loader.get_single_node()
        duplicates = duplicate_keys(root)  # before construction flattens merge keys
        data = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise YamlProblem(_problem(exc, text)) from None
    except RecursionError:  # a last resort; MAX_DEPTH should stop it first
        raise YamlProblem(Problem((), "not valid YAML: nested too deeply", 1)) from None
    finally:
        if loader is not None:
            loader.dispose()
    return root, data, duplicates


def duplicate_keys(root: Node | None) -> list[Problem]:
    """A key given twice in one mapping (YAML would silently keep the last), at its field path,
    naming both lines. Merge keys (`<<: *base`) may be overridden: that is what they are for."""
    problems: list[Problem] = []
    visited: set[int] = set()  # aliases share nodes: each is checked once
    stack: list[tuple[Node | None, tuple[PathPart, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if key.tag == _MERGE:
                    continue
                if not isinstance(key, ScalarNode):
                    stack.append((value, path))
                    continue
                line = key.start_mark.line + 1
                where = (*path, str(key.value))
                if (key.tag, key.value) in first:
                    problems.append(Problem(
                        where, f"duplicate key {key.value!r} (also at line "
                        f"{first[key.tag, key.value]}; YAML would silently keep the last)", line,
                    ))
                else:
                    first[key.tag, key.value] = line
                stack.append((value, where))
        elif isinstance(node, SequenceNode):
            stack.extend((child, (*path, i)) for i, child in enumerate(node.value))
    return problems


def _problem(exc: yaml.YAMLError, text: str) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    else:  # a ReaderError (a character YAML forbids) carries a position instead
        position = getattr(exc, "position", 0) or 0
        line = text.count("\n", 0, position) + 1
        column = position - text.rfind("\n", 0, position)
    what = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{context}: {what}" if context else str(what)
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        detail = f"character U+{code:04X} is not allowed in YAML"
    return Problem((), f"not valid YAML: {detail} (column {column})", line)
