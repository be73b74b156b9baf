"""The route table: YAML routes → pool clusters, with session hashing and safe retries."""

from __future__ import annotations

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2

from control_plane.resources import protos
from kvgate.config.model import Config, Route
from kvgate.contract.envoy import (
    DESTINATION_KEY,
    EXT_PROC_FILTER,
    HEADER_MUTATION_FILTER,
    PD_METADATA_KEY,
    POOL_HEADER,
    POOL_METADATA_KEY,
    PROMPT_METADATA_KEY,
    ROUTE_CONFIG_NAME,
    pool_cluster_name,
)
from kvgate.contract.modes import RoutingMode
from kvgate.session import SESSION_KEY_HEADER

# Only failures before the engine saw the request: retrying those never duplicates generation.
RETRY_ON = "connect-failure,refused-stream,reset"


def route_configuration(
    config: Config, mode: RoutingMode = RoutingMode.AFFINITY
) -> route_pb2.RouteConfiguration:
    return route_pb2.RouteConfiguration(
        name=ROUTE_CONFIG_NAME,
        # Defence in depth: header_mutation strips it first; nothing may forward it upstream.
        request_headers_to_remove=[DESTINATION_KEY, POOL_HEADER],
        virtual_hosts=[
            rc.VirtualHost(
                name="kvgate",
                domains=["*"],
                routes=[*(_route(route, config, mode) for route in config.routes),
                        _not_found(mode)],
            )
        ],
        response_headers_to_add=_upstream_header(config),
    )


def _upstream_header(config: Config) -> list[base_pb2.HeaderValueOption]:
    """Opt-in (`upstream_header:`): the serving engine's `ip:port`, set by Envoy whatever the
    engine is, replacing any value the engine itself sent under that name."""
    if config.upstream_header is None:
        return []
    return [base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=config.upstream_header, value="%UPSTREAM_HOST%"),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )]


def _route(route: Route, config: Config, mode: RoutingMode) -> rc.Route:
    match = rc.RouteMatch(
        headers=[
            rc.HeaderMatcher(
                name=name, string_match=string_pb2.StringMatcher(exact=value)
            )
            for name, value in route.match.headers
        ],
    )
    if route.match.path is not None:
        match.path = route.match.path
    else:
        match.prefix = route.match.prefix
    action = rc.RouteAction(
        cluster=pool_cluster_name(route.pool),
        timeout=protos.duration(route.timeout),
        # First present session header wins, exactly as ext_proc reads it; then the body's
        # key as Envoy's Lua filter carries it, the bytes ext_proc's first placement hashes.
        hash_policy=[
            rc.RouteAction.HashPolicy(
                header=rc.RouteAction.HashPolicy.Header(header_name=name), terminal=True
            )
            for name in (*config.session.headers, SESSION_KEY_HEADER)
        ],
        retry_policy=rc.RetryPolicy(
            retry_on=RETRY_ON,
            num_retries=protos.u32(2),
            retry_host_predicate=[
                rc.RetryPolicy.RetryHostPredicate(
                    name="envoy.retry_host_predicates.previous_hosts",
                    typed_config=protos.pack(previous_hosts_pb2.PreviousHostsPredicate()),
                )
            ],
            host_selection_retry_max_attempts=5,
        ),
    )
    if route.timeout == 0:
        # No overall deadline for minutes-long streams, but a stalled one is still cut.
        action.idle_timeout.CopyFrom(protos.duration(600.0))
    return rc.Route(
        name=f"{route.pool}:{route.match.describe}",
        match=match,
        route=action,
        typed_per_filter_config=_tell_pool(route.pool, config) if mode.uses_ext_proc else {},
    )


def _tell_pool(pool: str, config: Config) -> dict[str, any_pb2.Any]:
    """How ext_proc learns the route's pool: gRPC initial metadata, or over HTTP a request
    header this route sets after the gateway's header_mutation filter removed any client copy
    (and overwrites, should one survive); the route removes it again before the engine."""
    if config.ext_proc.transport == "http":
        header = header_mutation_pb2.HeaderMutationPerRoute(
            mutations=header_mutation_pb2.Mutations(request_mutations=[
                mutation_rules_pb2.HeaderMutation(append=base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=POOL_HEADER, value=pool),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                ))
            ])
        )
        return {HEADER_MUTATION_FILTER: protos.pack(header)}
    per_route = ext_proc_pb2.ExtProcPerRoute(
        overrides=ext_proc_pb2.ExtProcOverrides(
            grpc_initial_metadata=[base_pb2.HeaderValue(key=POOL_METADATA_KEY, value=pool)]
        )
    )
    if config.pool(pool).disaggregated:
        # The two-stage wire reads the body: ext_proc gets it, buffered, on the same stream.
        per_route.overrides.grpc_initial_metadata.append(
            base_pb2.HeaderValue(key=PD_METADATA_KEY, value="1"))
        per_route.overrides.processing_mode.CopyFrom(pd_processing_mode())
    elif config.placement.load_gate.reads_prompts:
        # The prefix step: ext_proc may ask for a request's body (new sessions, moves), on the
        # same stream; the route itself sends headers only.
        per_route.overrides.grpc_initial_metadata.append(
            base_pb2.HeaderValue(key=PROMPT_METADATA_KEY, value="1"))
    return {EXT_PROC_FILTER: protos.pack(per_route)}


def pd_processing_mode() -> processing_mode_pb2.ProcessingMode:
    """The request body buffered, nothing else: a P/D route's mode, and the one override the
    prefix step's ext_proc may ask for (listener.py)."""
    mode = processing_mode_pb2.ProcessingMode
    return mode(request_header_mode=mode.SEND, response_header_mode=mode.SKIP,
                request_body_mode=mode.BUFFERED, response_body_mode=mode.NONE,
                request_trailer_mode=mode.SKIP, response_trailer_mode=mode.SKIP)



def _not_found(mode: RoutingMode) -> rc.Route:
    """Every path no route serves: 404 from Envoy itself, without asking ext_proc (no binding is
    made for a request nobody serves) and without reaching an engine."""
    disabled = ext_proc_pb2.ExtProcPerRoute(disabled=True)
    return rc.Route(
        name="kvgate:not-found",
        match=rc.RouteMatch(prefix="/"),
        direct_response=rc.DirectResponseAction(
            status=404,
            # The message of the JSON error the client gets (local_replies.py).
            body=base_pb2.DataSource(inline_string="no route: this gateway serves only its "
                                                   "configured paths"),
        ),
        typed_per_filter_config=(
            {EXT_PROC_FILTER: protos.pack(disabled)} if mode is RoutingMode.AFFINITY else {}
        ),
    )
