"""Body-session filters (pure builders) and ext_proc's choice among the session sources."""

from __future__ import annotations

import re

from envoy.extensions.common.matching.v3 import extension_matcher_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2

from control_plane.resources.session_filters import (
    JSON_CONTENT_TYPE,
    body_session_filters,
    buffer_limit,
)
from kvgate.config.model import Session
from kvgate.routing.sources import BodyFields, SessionSources, Source
from kvgate.session import (
    COLON_IMPLICIT_KEY,
    IMPLICIT_KEY,
    IMPLICIT_PREFIX,
    UNCARRIED_KEY,
    carry_key,
    uncarry_key,
)


def _wrapped(session: Session) -> list[extension_matcher_pb2.ExtensionWithMatcher]:
    found = []
    for http_filter in body_session_filters(session):
        wrapped = extension_matcher_pb2.ExtensionWithMatcher()
        http_filter.typed_config.Unpack(wrapped)
        found.append(wrapped)
    return found


def test_each_body_field_is_a_rule_with_its_dotted_path_as_key() -> None:
    j2m_filter, _ = _wrapped(Session())
    config = json_to_metadata_pb2.JsonToMetadata()
    j2m_filter.extension_config.typed_config.Unpack(config)
    rules = config.request_rules.rules
    assert [[s.key for s in r.selectors] for r in rules] == [
        ["prompt_cache_key"], ["user"], ["metadata", "session_id"]]
    assert [r.on_present.key for r in rules] == ["prompt_cache_key", "user", "metadata.session_id"]
    assert {r.on_present.metadata_namespace for r in rules} == {"kvgate.session"}
    assert all(r.on_present.type == config.STRING for r in rules)


def test_filters_follow_the_switches() -> None:
    assert len(body_session_filters(Session())) == 2
    # The Lua filter carries a body field's key too, so it stays with the implicit key off.
    assert [f.name for f in body_session_filters(Session(implicit=False))] == [
        "envoy.filters.http.json_to_metadata", "kvgate.session_key"]
    assert [f.name for f in body_session_filters(Session(body_fields=()))] == [
        "kvgate.session_key"]
    assert body_session_filters(Session(body_fields=(), implicit=False)) == []


def test_skipped_when_too_big_unsized_not_json_or_a_header_is_there() -> None:
    session = Session(headers=("x-session-id", "x-litellm-session-id"), body_limit=65536)
    for wrapped in _wrapped(session):
        (matcher,) = wrapped.xds_matcher.matcher_list.matchers
        assert matcher.on_match.action.name == "skip"
        predicates = matcher.predicate.or_matcher.predicate
        length, content_type, *headers = predicates
        length_regex = length.not_matcher.single_predicate.value_match.safe_regex.regex
        assert re.fullmatch(length_regex, "65536") and not re.fullmatch(length_regex, "65537")
        assert content_type.not_matcher.single_predicate.value_match.safe_regex.regex == (
            JSON_CONTENT_TYPE)
        assert [h.single_predicate.input.name for h in headers] == [
            "header:x-session-id", "header:x-litellm-session-id"]
    assert buffer_limit(session) == 1024 * 1024
    assert buffer_limit(Session(body_limit=4 << 20)) > 4 << 20


def test_json_content_types() -> None:
    for ok in ("application/json", "Application/JSON", "application/json; charset=utf-8",
               "application/vnd.api+json"):
        assert re.fullmatch(JSON_CONTENT_TYPE, ok), ok
    for bad in ("text/plain", "application/x-www-form-urlencoded", "application/jsonl",
                "multipart/form-data"):
        assert not re.fullmatch(JSON_CONTENT_TYPE, bad), bad


def _body(**fields: str) -> BodyFields:
    return fields


def test_sources_in_order_header_body_implicit() -> None:
    sources = SessionSources(Session(headers=("x-session-id", "x-agent")))
    body = _body(**{"user": "u1", "metadata.session_id": "m1", IMPLICIT_KEY: "chat:1:x"})
    assert sources.pick({"x-agent": b"a1"}, body) == (b"a1", Source.HEADER, None)
    assert sources.pick({"x-session-id": b"  ", "x-agent": b"a1"}, None) == (
        b"a1", Source.HEADER, None)
    assert sources.pick({}, body) == (b"u1", Source.BODY, None)
    assert sources.pick({}, _body(**{"metadata.session_id": "m1", "user": " "})) == (
        b"m1", Source.BODY, None)
    assert sources.pick({}, _body(**{IMPLICIT_KEY: "chat:1:x"})) == (
        IMPLICIT_PREFIX + b"chat:1:x", Source.IMPLICIT, None)
    assert sources.pick({}, None) == (b"", Source.NONE, None)
    assert sources.pick({}, _body(other="x")) == (b"", Source.NONE, None)
    # A field that is not text reaches the core as empty text (ext_proc's transports).
    assert sources.pick({}, _body(user="", **{"metadata.session_id": "m1"})) == (
        b"m1", Source.BODY, None)
    assert sources.pick({}, _body(**{IMPLICIT_KEY: ""})) == (b"", Source.NONE, None)


def test_sources_honour_the_config() -> None:
    implicit_only = SessionSources(Session(body_fields=()))
    body = _body(user="u1", **{IMPLICIT_KEY: "k"})
    assert implicit_only.pick({}, body).source is Source.IMPLICIT
    no_implicit = SessionSources(Session(implicit=False))
    assert no_implicit.pick({}, _body(**{IMPLICIT_KEY: "k"})).source is Source.NONE
    # The key's name before 2026-12-05, as an Envoy not yet reconfigured writes it.
    assert implicit_only.pick({}, _body(**{COLON_IMPLICIT_KEY: "k"})) == (
        IMPLICIT_PREFIX + b"k", Source.IMPLICIT, None)


def test_carried_keys_any_bytes_and_back() -> None:
    # The usual ids are unchanged (their ring position is the header's); others are valid
    # header values, and decode to what was sent.
    for usual in (b"conv-3", b"user_1@bank.example", b"a b"):
        assert carry_key(usual) == usual
    for odd in (b"a\nb", b"\r", b"\x00x", b"x\x7f", b"\xff\xfe", "é".encode(), b"100%",
                b" lead", b"trail ", b"%41", IMPLICIT_PREFIX + b"chat:1:x"):
        wire = carry_key(odd)
        assert all(0x20 <= b < 0x7F for b in wire) and wire.strip() == wire, wire
        assert uncarry_key(wire) == odd
    assert carry_key(b"a\nb%") == b"a%0Ab%25"
    for not_carried in (UNCARRIED_KEY.encode(), b"%", b"%4", b"%zz", b"a%+1"):
        assert uncarry_key(not_carried) is None, not_carried


def test_the_carried_key_after_the_headers_before_the_metadata() -> None:
    sources = SessionSources(Session())
    body = _body(user="from-metadata")
    wire = carry_key(b"line\nbreak")
    assert sources.pick({"x-kvgate-session-key": wire}, body) == (
        b"line\nbreak", Source.BODY, wire)
    assert sources.pick({"x-session-id": b"h", "x-kvgate-session-key": wire}, body) == (
        b"h", Source.HEADER, None)
    implicit = carry_key(IMPLICIT_PREFIX + b"chat:1:x")
    assert sources.pick({"x-kvgate-session-key": implicit}, None) == (
        IMPLICIT_PREFIX + b"chat:1:x", Source.IMPLICIT, implicit)
    assert sources.pick({"x-kvgate-session-key": UNCARRIED_KEY.encode()}, body) == (
        b"", Source.UNCARRIED, None)
