"""Configuration problems, each tied to the field path (and line) it concerns."""

from __future__ import annotations

from dataclasses import dataclass

PathPart = str | int


def format_path(parts: tuple[PathPart, ...]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


@dataclass(frozen=True, slots=True)
class Problem:
    path: tuple[PathPart, ...]
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{format_path(self.path)}: {self.message}"


class ConfigError(Exception):
    """A configuration that cannot be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(f"{prefix}{problem}" for problem in self.problems)
