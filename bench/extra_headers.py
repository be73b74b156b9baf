"""Extra request headers for `kvgate bench` (`--header NAME:VALUE`, `--header-file PATH`), e.g. a
gateway's API key. A value may be a secret: nothing here puts one in an error message, and a run
records the names only (:func:`header_names`)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

Header = tuple[str, str]

# RFC 9110's field-name: a token.
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00\r\n]")


def check_header(name: str, value: str, where: str) -> Header:
    """``(name, value)`` stripped, or ValueError naming ``where`` and the name, never the value."""
    name, value = name.strip(), value.strip()
    if not name:
        raise ValueError(f"{where}: the NAME before ':' is empty (expected NAME:VALUE)")
    if not _NAME.fullmatch(name):
        raise ValueError(f"{where}: {name!r} is not a valid header name")
    if _BAD_VALUE.search(value):
        raise ValueError(f"{where}: the value of {name} holds a line break or NUL")
    return name, value


def parse_header(text: str) -> Header:
    """``NAME:VALUE`` (the value may contain colons): an argparse type."""
    name, sep, value = text.partition(":")
    try:
        if not sep:
            raise ValueError("expected NAME:VALUE, found no ':' (the text is not shown: it may "
                             "be a secret)")
        return check_header(name, value, "header")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def read_header_file(path: Path) -> list[Header]:
    """``NAME: VALUE`` lines (curl's ``-H @file``); blank lines and ``#`` comments skipped. Keeps
    a secret off the command line, where every local user can read it in the process list."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--header-file {path}: cannot read it ({type(exc).__name__})") from None
    headers = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition(":")
        where = f"--header-file {path}, line {number}"
        if not sep:
            raise ValueError(f"{where}: expected NAME: VALUE, found no ':'")
        headers.append(check_header(name, value, where))
    return headers


def check_headers(headers: Sequence[Header], session_header: str | None) -> tuple[Header, ...]:
    """Refuse a name given twice, or the session header when the bench sets it (either would
    make one of the two values silently lost)."""
    seen: set[str] = set()
    for name, _ in headers:
        key = name.lower()
        if key in seen:
            raise ValueError(f"header {name} is given twice (--header / --header-file)")
        if session_header is not None and key == session_header.lower():
            raise ValueError(f"header {name} is the session header, which the bench sets per "
                             "request (--session-in header); choose --session-header or another "
                             "--session-in")
        seen.add(key)
    return tuple(headers)


def header_names(headers: Iterable[Header]) -> list[str]:
    """What a run records of its extra headers: their names, never their values."""
    return [name for name, _ in headers]
