"""`routes:` which request paths go to which pool; without them, the inference API only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.config.errors import PathPart
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Custom, Duration, ListOf, Section, key, key_names


def _request_path(f: Fields, value: Any, path: Path) -> str | None:
    return f.http_path(value, path, query=False)


def _headers(f: Fields, value: Any, path: Path) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    if not isinstance(value, dict):
        f.error(path, "must be a mapping of header name to value")
        return ()
    for name_, val in value.items():
        name = f.header_name(name_, (*path, str(name_)))
        text = f.string(val, (*path, str(name_)))
        if name is not None and text is not None:
            headers.append((name, text))
    return tuple(headers)


def _dump_headers(headers: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(headers)


_PATH = Custom(_request_path, "request path")


@dataclass(frozen=True, slots=True)
class RouteMatch:
    prefix: str = key(_PATH, "the path starts with it", default="/")
    headers: tuple[tuple[str, str], ...] = key(
        Custom(_headers, "`{name: value}`", _dump_headers), "exact header values the request "
        "must carry too", default=())
    # An exact path (query ignored); when set, `prefix` is not used.
    path: str | None = key(_PATH, "exactly this path (query ignored); give either `prefix` or "
                           "`path`", default=None, default_doc="*(none)*")

    @property
    def describe(self) -> str:
        return self.path if self.path is not None else f"{self.prefix}*"


def _read_match(f: Fields, value: Any, path: Path) -> RouteMatch:
    raw = f.mapping(value, path, key_names(RouteMatch))
    prefix = f.optional(raw, "prefix", path, lambda v, p: _request_path(f, v, p), "/")
    exact = f.optional(raw, "path", path, lambda v, p: _request_path(f, v, p), None)
    if "prefix" in raw and "path" in raw:
        f.error((*path, "path"), "give either prefix or path, not both")
    headers = _headers(f, raw.get("headers") or {}, (*path, "headers"))
    return RouteMatch(prefix, headers, exact)


def _dump_match(match: RouteMatch) -> dict[str, Any]:
    where = {"path": match.path} if match.path is not None else {"prefix": match.prefix}
    return {**where, "headers": dict(match.headers)}


class _Match(Section):
    def dump(self, value: Any) -> Any:
        return _dump_match(value)


@dataclass(frozen=True, slots=True)
class Route:
    match: RouteMatch = key(_Match(RouteMatch, _read_match), "what the route takes",
                            default_doc="`{prefix: /}`")
    pool: str = key(Custom(Fields.string, "pool name"), "the pool serving the route",
                    default_doc="required")
    timeout: float = key(Duration(0.0, 86400.0), "0 = no route timeout (long streams; a stream "
                         "idle for 10 minutes is still cut)", default=0.0)


def _read_route(f: Fields, value: Any, path: Path) -> Route | None:
    raw = f.mapping(value, path, key_names(Route))
    match_path: tuple[PathPart, ...] = (*path, "match")
    match = _read_match(f, raw.get("match"), match_path)
    if "pool" not in raw:
        f.error((*path, "pool"), "required")
        return None
    pool = f.string(raw["pool"], (*path, "pool"))
    timeout = f.optional(raw, "timeout", path, lambda v, p: f.duration(v, p, 0.0, 86400.0), 0.0)
    if pool is None:
        return None
    return Route(match, pool, timeout)


def read_routes(f: Fields, value: Any, path: Path) -> tuple[Route, ...]:
    return tuple(route for i, item in enumerate(f.sequence(value, path))
                 if (route := _read_route(f, item, (*path, i))) is not None)


ROUTES = ListOf(Section(Route, _read_route), read_routes)

# Without `routes:`, a one-pool gateway serves these and nothing else (docs/operating.md,
# "Routes"): the OpenAI-compatible inference API as vLLM serves it. Not its /metrics, /health,
# /tokenize, profiling, sleep, LoRA loading (/v1/load_lora_adapter is under /v1/ too) or any
# admin path.
INFERENCE_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/models",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/rerank",
    "/v1/score",
)
# Sub-resources: GET /v1/responses/{id}, POST /v1/responses/{id}/cancel.
INFERENCE_PREFIXES = ("/v1/responses/",)


def inference_routes(pool: str) -> tuple[Route, ...]:
    """The default route table for one pool: exactly the inference API, each without timeout."""
    return (
        *(Route(RouteMatch(path=path), pool) for path in INFERENCE_PATHS),
        *(Route(RouteMatch(prefix=prefix), pool) for prefix in INFERENCE_PREFIXES),
    )
