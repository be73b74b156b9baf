"""Names in the config (pools, DDR KV pools): lower-case, as Envoy cluster names and etcd keys
take them; and an engine's role, which every source of engines may set."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Choice, Custom
from kvgate.contract.states import Role

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")


def matching(pattern: re.Pattern[str], problem: str) -> Callable[[Fields, Any, Path], str | None]:
    """A reader of strings that `pattern` matches whole; `problem` says what is wrong, before
    the value given."""
    def read(f: Fields, value: Any, path: Path) -> str | None:
        text = f.string(value, path)
        if text is not None and not pattern.fullmatch(text):
            f.error(path, f"{problem}, got {text!r}")
            return None
        return text
    return read


name = matching(_NAME, "must be lower-case letters, digits, '-', '_' or '.'")


NAME_KIND = Custom(name, "lower-case name (letters, digits, `-`, `_`, `.`)")

_ROLE_WORDS = Choice(tuple(r.value for r in Role))


def role(f: Fields, value: Any, path: Path) -> Role | None:
    """An engine's `role` (kvgate.contract.states.Role): static endpoints, discovery sources."""
    word = _ROLE_WORDS.read(f, value, path)
    return None if word is None else Role(word)


ROLE_KIND = Custom(role, "`both`, `prefill` or `decode`", lambda value: str(value.value))
