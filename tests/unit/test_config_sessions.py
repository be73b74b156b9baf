"""Config: where sessions come from (headers, body fields, the implicit key) and the body bound."""

from __future__ import annotations

import pytest

from kvgate.config import Config, ConfigError, load_text
from kvgate.config.dump import to_yaml

BAD = [
    ("session: {body_fields: [metadata..session_id]}\n",
     "session.body_fields[0]: must be a JSON field or a dotted path"),
    ("session: {body_fields: ['messages[0]']}\n",
     "session.body_fields[0]: must be a JSON field or a dotted path"),
    ("session: {body_fields: [a.b.c.d.e.f.g.h.i]}\n",
     "session.body_fields[0]: must be a JSON field or a dotted path of at most 8 fields"),
    ("session: {body_fields: prompt_cache_key}\n",
     "session.body_fields: must be a list, got str 'prompt_cache_key'"),
    ("session: {body_fields: [1]}\n", "session.body_fields[0]: must be a non-empty string"),
    ("session: {implicit: maybe}\n", "session.implicit: must be on or off, got 'maybe'"),
    ("session: {implicit: 1}\n", "session.implicit: must be on or off, got 1"),
    ("session: {body_limit: 4MB}\n",
     "session.body_limit: must be a size like 512KiB, 4MiB or a number of bytes, got '4MB'"),
    ("session: {body_limit: 100}\n", "session.body_limit: must be between 1024 and 67108864"),
    ("session: {body_limit: 1GiB}\n", "session.body_limit: must be between 1024 and 67108864"),
]


def _without_pools(text: str) -> Config:
    """Session keys alone: a config without pools loads only as `kvgate up`'s."""
    return load_text(text, require_pools=False)


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_bad_session_keys_are_named(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text, source="k.yaml")
    assert expected in caught.value.render(), caught.value.render()


def test_session_source_defaults() -> None:
    session = _without_pools("{}\n").session
    assert session.headers == ("x-session-id",)
    assert session.body_fields == ("prompt_cache_key", "user", "metadata.session_id")
    assert session.implicit is True
    assert session.body_limit == 4 * 1024 * 1024


@pytest.mark.parametrize(("written", "expected"), [
    ("on", True), ("off", False), ("'on'", True), ("'OFF'", False), ("true", True),
])
def test_implicit_reads_on_and_off(written: str, expected: bool) -> None:
    assert _without_pools(f"session: {{implicit: {written}}}\n").session.implicit is expected


def test_body_fields_keep_order_drop_duplicates_and_may_be_empty() -> None:
    config = _without_pools("session: {body_fields: [user, conversation.id, user, x-key]}\n")
    assert config.session.body_fields == ("user", "conversation.id", "x-key")
    assert _without_pools("session: {body_fields: []}\n").session.body_fields == ()


@pytest.mark.parametrize(("written", "expected"), [
    ("512KiB", 512 * 1024), ("4MiB", 4 * 1024 * 1024), ("65536", 65536), ("'2 MiB'", 2 << 20),
])
def test_body_limit_sizes(written: str, expected: int) -> None:
    assert _without_pools(f"session: {{body_limit: {written}}}\n").session.body_limit == expected


def test_session_keys_round_trip() -> None:
    config = load_text(
        "session: {body_fields: [user], implicit: off, body_limit: 64KiB}\n"
        "pools: [{name: a, endpoints: [10.0.0.1:8000]}]\n"
    )
    assert load_text(to_yaml(config)) == config
