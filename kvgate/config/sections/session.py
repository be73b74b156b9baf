"""`session:` where a request's session id comes from, and how long a binding lives."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Custom, Duration, Integer, ListOf, OnOff, Size, key
from kvgate.contract.envoy import DESTINATION_KEY

_BODY_FIELD = re.compile(r"[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64})*")
_HEADERS = ("x-session-id",)


def session_header(f: Fields, value: Any, path: Path) -> str | None:
    """A header name that may carry a session id (not a pseudo-header, not the destination)."""
    name = f.header_name(value, path)
    if name is not None and (name.startswith(":") or name == DESTINATION_KEY):
        f.error(path, f"{name!r} cannot carry a session id")
        return None
    return name


def _headers(f: Fields, value: Any, path: Path) -> tuple[str, ...] | None:
    items = f.sequence(value, path)
    names = [session_header(f, v, (*path, i)) for i, v in enumerate(items)]
    if isinstance(value, list) and not items:
        f.error(path, "must name at least one header")
    return tuple(dict.fromkeys(n for n in names if n)) or None


def _body_field(f: Fields, value: Any, path: Path) -> str | None:
    """A dotted path into the JSON body: object keys only (Envoy's json_to_metadata selectors)."""
    text = f.string(value, path)
    if text is None:
        return None
    if not _BODY_FIELD.fullmatch(text) or text.count(".") >= 8:
        f.error(path, f"must be a JSON field or a dotted path of at most 8 fields "
                f"(letters, digits, '_', '-'), such as metadata.session_id; got {text!r}")
        return None
    return text


def _body_fields(f: Fields, value: Any, path: Path) -> tuple[str, ...]:
    items = f.sequence(value, path)
    fields = [_body_field(f, v, (*path, i)) for i, v in enumerate(items)]
    return tuple(dict.fromkeys(name for name in fields if name))  # [] reads no field


_NAMES = Custom(Fields.header_name, "header name")
_FIELDS = Custom(_body_field, "dotted JSON field")


@dataclass(frozen=True, slots=True)
class Session:
    headers: tuple[str, ...] = key(
        ListOf(_NAMES, _headers), "headers carrying the session id; the first present, "
        "non-empty one wins", default=_HEADERS)
    idle_ttl: float = key(Duration(2.0, 30 * 86400.0), "a binding unused this long is "
                          "forgotten (kept at least this long, gone by 1.75×)", default=3600.0)
    body_fields: tuple[str, ...] = key(
        ListOf(_FIELDS, _body_fields), "JSON body fields carrying the session id when no header "
        "does (dotted paths into objects); the first present, non-empty one wins; `[]` reads "
        "none", default=("prompt_cache_key", "user", "metadata.session_id"))
    implicit: bool = key(OnOff(), "with no id anywhere, a conversation key from the prompt's "
                         "leading content (Envoy, Lua); `off`: such requests are sessionless",
                         default=True)
    body_limit: int = key(
        Size(1024, 64 * 1024 * 1024), "bodies up to this size (as their `Content-Length` says) "
        "are read for the two keys above; larger ones pass unread (a chunked body is sized by "
        "then: `max_request_bytes` holds it whole first)",
        default=4 * 1024 * 1024)
    max_bindings: int = key(
        Integer(0, 1_000_000_000), "per pool: past it a new session is routed on Envoy's ring "
        "without a binding (counted, logged); existing bindings are never evicted for "
        "newcomers. A million bindings take ~200 MB in each ext_proc replica. 0: no cap",
        default=1_000_000)
