"""Names in the config (pools, DDR KV pools): lower-case, as Envoy cluster names and etcd keys
take them."""

from __future__ import annotations

import re
from typing import Any

from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Custom

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")


def name(f: Fields, value: Any, path: Path) -> str | None:
    text = f.string(value, path)
    if text is not None and not _NAME.fullmatch(text):
        f.error(path, f"must be lower-case letters, digits, '-', '_' or '.', got {text!r}")
        return None
    return text


NAME_KIND = Custom(name, "lower-case name (letters, digits, `-`, `_`, `.`)")
