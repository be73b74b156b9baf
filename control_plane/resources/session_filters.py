"""The filters that find a session in the request body, before ext_proc, inside Envoy.

- `json_to_metadata` (C++) copies each configured body field (`session.body_fields`, dotted
  paths) into dynamic metadata `kvgate.session`, key = the path.
- a Lua filter (implicit_lua.py) takes the first field found, else (`session.implicit`) the
  implicit conversation key, and sets it percent-encoded as request header
  `x-kvgate-session-key`, which ext_proc decodes and Envoy's rings hash.
ext_proc receives that header with the request headers; no body travels to it. (The metadata
namespace is still forwarded, for ext_proc replicas of earlier versions.)

Both filters wait for the whole body, so both are wrapped in a matcher that skips them — the
request then goes on at once, unread — when reading the body could not help or could fail:
- a configured session header is present (it wins anyway);
- the body is larger than `session.body_limit` (a chunked body has its length stated by then:
  the gateway's body-size limit, local_replies.py, holds it whole first): Envoy would answer
  413 once a buffering filter holds more than the connection's buffer limit, so such a
  request is routed as if it carried no session instead;
- the content type is not JSON.
Streaming responses are untouched: only request bodies are read.
"""

from __future__ import annotations

from typing import TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.common.matching.v3 import extension_matcher_pb2
from envoy.extensions.filters.common.matcher.action.v3 import skip_action_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.type.matcher.v3 import http_inputs_pb2, regex_pb2
from google.protobuf.message import Message
from xds.core.v3 import extension_pb2 as xds_extension_pb2
from xds.type.matcher.v3 import matcher_pb2, string_pb2
from xds.type.matcher.v3 import regex_pb2 as xds_regex_pb2

from control_plane.resources import protos
from control_plane.resources.digits import at_most
from control_plane.resources.implicit_lua import session_key_script
from kvgate.config.model import Session
from kvgate.session import BODY_METADATA_NAMESPACE

JSON_TO_METADATA_FILTER = "envoy.filters.http.json_to_metadata"
SESSION_KEY_FILTER = "kvgate.session_key"
# application/json, with or without parameters, and application/<anything>+json.
JSON_CONTENT_TYPE = r"(?i)application/([a-z0-9.+-]*\+)?json\s*(;.*)?"

_J2M = json_to_metadata_pb2.JsonToMetadata
_Predicate: TypeAlias = matcher_pb2.Matcher.MatcherList.Predicate


def body_session_filters(session: Session) -> list[hcm.HttpFilter]:
    """The filters to put before ext_proc (none when neither source is enabled)."""
    filters: list[hcm.HttpFilter] = []
    if session.body_fields:
        filters.append(_skippable(JSON_TO_METADATA_FILTER, _json_to_metadata(session), session))
    if session.body_fields or session.implicit:
        script = session_key_script(session.body_fields, session.implicit)
        lua = lua_pb2.Lua(default_source_code=base_pb2.DataSource(inline_string=script))
        lua.clear_route_cache.CopyFrom(protos.bool_value(False))  # no route reads its header
        filters.append(_skippable(SESSION_KEY_FILTER, lua, session))
    return filters


def buffer_limit(session: Session) -> int:
    """The listener's per-connection buffer limit: Envoy's 1 MiB default, or more so that a
    body of `session.body_limit` can be held whole while it is read."""
    return max(1024 * 1024, session.body_limit + 64 * 1024)


def _json_to_metadata(session: Session) -> json_to_metadata_pb2.JsonToMetadata:
    rules = [
        _J2M.Rule(
            selectors=[_J2M.Selector(key=part) for part in field.split(".")],
            # A string (or a number, as its text); objects, lists, empty or >8 KiB: ignored.
            on_present=_J2M.KeyValuePair(
                metadata_namespace=BODY_METADATA_NAMESPACE, key=field, type=_J2M.STRING
            ),
        )
        for field in session.body_fields
    ]
    return _J2M(
        request_rules=_J2M.MatchRules(
            rules=rules,
            allow_content_types_regex=regex_pb2.RegexMatcher(regex=JSON_CONTENT_TYPE),
        )
    )


def _skippable(name: str, config: Message, session: Session) -> hcm.HttpFilter:
    """`config` behind a matcher that skips it in the cases the module docstring lists."""
    skip_when = _Predicate(
        or_matcher=_Predicate.PredicateList(
            predicate=[
                _not(_header_matches("content-length", at_most(session.body_limit))),
                _not(_header_matches("content-type", JSON_CONTENT_TYPE)),
                *(_header_matches(name, r".*\S.*") for name in session.headers),
            ]
        )
    )
    matcher = matcher_pb2.Matcher(
        matcher_list=matcher_pb2.Matcher.MatcherList(
            matchers=[
                matcher_pb2.Matcher.MatcherList.FieldMatcher(
                    predicate=skip_when,
                    on_match=matcher_pb2.Matcher.OnMatch(
                        action=xds_extension_pb2.TypedExtensionConfig(
                            name="skip", typed_config=protos.pack(skip_action_pb2.SkipFilter())
                        )
                    ),
                )
            ]
        )
    )
    wrapped = extension_matcher_pb2.ExtensionWithMatcher(
        xds_matcher=matcher,
        extension_config=protos.typed_extension(name, config),
    )
    return hcm.HttpFilter(name=name, typed_config=protos.pack(wrapped))


def _header_matches(header: str, regex: str) -> _Predicate:
    """True when the request header is present and its whole value matches `regex` (RE2)."""
    return _Predicate(
        single_predicate=_Predicate.SinglePredicate(
            input=xds_extension_pb2.TypedExtensionConfig(
                name=f"header:{header}",
                typed_config=protos.pack(
                    http_inputs_pb2.HttpRequestHeaderMatchInput(header_name=header)
                ),
            ),
            value_match=string_pb2.StringMatcher(
                safe_regex=xds_regex_pb2.RegexMatcher(
                    google_re2=xds_regex_pb2.RegexMatcher.GoogleRE2(), regex=regex
                )
            ),
        )
    )


def _not(predicate: _Predicate) -> _Predicate:
    return _Predicate(not_matcher=predicate)

