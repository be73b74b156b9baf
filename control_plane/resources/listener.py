"""The gateway listener: strip client routing headers → ext_proc → router."""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import (
    backoff_pb2,
    base_pb2,
    config_source_pb2,
    grpc_service_pb2,
    http_service_pb2,
    http_uri_pb2,
)
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.http.upstream_codec.v3 import upstream_codec_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.type.matcher.v3 import string_pb2

from control_plane.resources import protos
from control_plane.resources.affinity import affinity_metadata
from control_plane.resources.local_replies import body_limit_filter, local_reply_config
from control_plane.resources.routes import pd_processing_mode
from control_plane.resources.session_filters import body_session_filters, buffer_limit
from kvgate.config.model import Config
from kvgate.contract.envoy import (
    DESTINATION_KEY,
    EXT_PROC_CLUSTER,
    EXT_PROC_FILTER,
    HEADER_MUTATION_FILTER,
    LB_NAMESPACE,
    LISTENER_NAME,
    POOL_HEADER,
    ROUTE_CONFIG_NAME,
    UPSTREAM_HEADER_MUTATION_FILTER,
)
from kvgate.contract.modes import RoutingMode
from kvgate.session import BODY_METADATA_NAMESPACE, SESSION_KEY_HEADER

_Mode = processing_mode_pb2.ProcessingMode


def gateway_listener(
    config: Config,
    *,
    routes: route_pb2.RouteConfiguration | None = None,
    mode: RoutingMode = RoutingMode.AFFINITY,
) -> listener_pb2.Listener:
    """The listener users call. `routes` are inlined if given, else fetched over RDS (ADS)."""
    manager = hcm.HttpConnectionManager(
        stat_prefix="kvgate",
        codec_type=hcm.HttpConnectionManager.AUTO,
        use_remote_address=protos.bool_value(True),
        normalize_path=protos.bool_value(True),
        merge_slashes=True,
        # An encoded slash would slip `/v1/responses/..%2f..%2fmetrics` past the routes to an
        # engine that decodes it; no inference path has one.
        path_with_escaped_slashes_action=hcm.HttpConnectionManager.REJECT_REQUEST,
        # Minutes-long prefill at peak may precede the first byte; stalled streams still end.
        stream_idle_timeout=protos.duration(600.0),
        request_timeout=protos.duration(0.0),
        max_request_headers_kb=protos.u32(96),
        # Errors Envoy itself answers, as OpenAI-style JSON (local_replies.py).
        local_reply_config=local_reply_config(config.max_request_bytes),
        http_filters=[
            _strip_destination(),
            body_limit_filter(config.max_request_bytes),
            # Sessions in the body: read by Envoy itself, handed to ext_proc as metadata.
            *(body_session_filters(config.session) if mode.uses_ext_proc else []),
            *([_ext_proc(config)] if mode.uses_ext_proc else []),
            _router(),
        ],
    )
    if routes is not None:
        manager.route_config.CopyFrom(routes)
    else:
        manager.rds.CopyFrom(
            hcm.Rds(
                route_config_name=ROUTE_CONFIG_NAME,
                config_source=config_source_pb2.ConfigSource(
                    ads=config_source_pb2.AggregatedConfigSource(),
                    resource_api_version=config_source_pb2.V3,
                ),
            )
        )
    return listener_pb2.Listener(
        name=LISTENER_NAME,
        address=protos.socket_address(config.listener),
        per_connection_buffer_limit_bytes=protos.u32(buffer_limit(config.session)),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=protos.pack(manager),
                    )
                ]
            )
        ],
    )


def _strip_destination() -> hcm.HttpFilter:
    """Client-sent routing headers go first: the destination, the pool header the route sets
    for the HTTP transport (the route's own setting runs after this filter-level one), and the
    session key only Envoy's Lua filter may set."""
    mutation = _removing(DESTINATION_KEY, POOL_HEADER, SESSION_KEY_HEADER)
    return hcm.HttpFilter(
        name=HEADER_MUTATION_FILTER, typed_config=protos.pack(mutation)
    )


def _removing(*names: str) -> header_mutation_pb2.HeaderMutation:
    return header_mutation_pb2.HeaderMutation(
        mutations=header_mutation_pb2.Mutations(
            request_mutations=[mutation_rules_pb2.HeaderMutation(remove=n) for n in names]
        )
    )


def _ext_proc(config: Config) -> hcm.HttpFilter:
    http = config.ext_proc.transport == "http"
    processor = ext_proc_pb2.ExternalProcessor(
        # ext_proc down or slow → the ring_hash fallback keeps sessions where they were.
        failure_mode_allow=True,
        message_timeout=protos.duration(config.ext_proc.message_timeout),
        processing_mode=_Mode(
            request_header_mode=_Mode.SEND,
            response_header_mode=_Mode.SKIP,
            request_body_mode=_Mode.NONE,
            response_body_mode=_Mode.NONE,
            request_trailer_mode=_Mode.SKIP,
            response_trailer_mode=_Mode.SKIP,
        ),
        # ext_proc needs only the session headers (and, over HTTP, the route's pool header;
        # with the load gate on, content-length, its estimate of the prompt's size);
        # sending less keeps each decision cheap.
        forward_rules=ext_proc_pb2.HeaderForwardingRules(
            allowed_headers=_exact_names(
                (*config.session.headers, SESSION_KEY_HEADER, *([POOL_HEADER] if http else []),
                 *config.placement.load_gate.request_headers)
            )
        ),
        metadata_options=ext_proc_pb2.MetadataOptions(
            # The session Envoy found in the body, sent with the request headers.
            forwarding_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=[BODY_METADATA_NAMESPACE]
            ),
            # Without this Envoy silently drops the metadata ext_proc returns.
            receiving_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(
                untyped=[LB_NAMESPACE]
            ),
        ),
        stat_prefix="kvgate",
    )
    if config.placement.load_gate.reads_prompts and not http:
        # The prefix step reads the body of a request whose placement weighs its prompt, and
        # only that one: ext_proc asks in its headers' answer, for this one mode only.
        processor.allow_mode_override = True
        processor.allowed_override_modes.append(pd_processing_mode())
    if any(pool.disaggregated for pool in config.pools):
        # A P/D route's ext_proc waits for a prefill engine: it asks for this much, per message.
        processor.max_message_timeout.CopyFrom(
            protos.duration(config.disaggregation.prefill_timeout + 1.0))
    if http:
        processor.http_service.CopyFrom(_http_service(config))
    else:
        processor.grpc_service.CopyFrom(_grpc_service(affinity_metadata(config.session)))
    return hcm.HttpFilter(name=EXT_PROC_FILTER, typed_config=protos.pack(processor))


def _http_service(config: Config) -> ext_proc_pb2.ExtProcHttpService:
    """ext_proc over HTTP/1.1 (Envoy: work in progress, outside its threat model): the
    cluster's address list and health check stand in for the gRPC retry policy."""
    return ext_proc_pb2.ExtProcHttpService(
        http_service=http_service_pb2.HttpService(
            http_uri=http_uri_pb2.HttpUri(
                uri=f"http://{EXT_PROC_CLUSTER}/process",
                cluster=EXT_PROC_CLUSTER,
                timeout=protos.duration(config.ext_proc.message_timeout),
            )
        )
    )


def _grpc_service(affinity: Sequence[tuple[str, str]]) -> grpc_service_pb2.GrpcService:
    return grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=EXT_PROC_CLUSTER),
        timeout=protos.duration(1.0),
        # Where the session was found, for the ext_proc cluster's hash policy (clusters.py
        # ext_proc_cluster): one session's requests to one replica.
        initial_metadata=[base_pb2.HeaderValue(key=key, value=value) for key, value in affinity],
        # A replica that just died refuses the stream: try another one before falling back.
        retry_policy=base_pb2.RetryPolicy(
            retry_on="connect-failure,refused-stream,unavailable,reset",
            num_retries=protos.u32(2),
            retry_back_off=backoff_pb2.BackoffStrategy(
                base_interval=protos.duration(0.005), max_interval=protos.duration(0.02)
            ),
            retry_host_predicate=[
                base_pb2.RetryPolicy.RetryHostPredicate(
                    name="envoy.retry_host_predicates.previous_hosts",
                    typed_config=protos.pack(previous_hosts_pb2.PreviousHostsPredicate()),
                )
            ],
            # On the ext_proc cluster's ring a retry walks on from the session's point until it
            # finds a replica not tried yet: with two replicas, five steps all landed on the one
            # that refused for ~3 % of its sessions (their decision lost to Envoy's fallback).
            host_selection_retry_max_attempts=64,
        ),
    )


def _exact_names(names: tuple[str, ...]) -> string_pb2.ListStringMatcher:
    return string_pb2.ListStringMatcher(
        patterns=[string_pb2.StringMatcher(exact=name) for name in names]
    )


def _router() -> hcm.HttpFilter:
    """The router; per upstream attempt it drops the session key (up to 32 KiB, for Envoy's
    own use). Not the route's `request_headers_to_remove`: that edits the request before the
    first attempt, and a retry's ring_hash pick would then find no key to hash."""
    router = router_pb2.Router(upstream_http_filters=[
        hcm.HttpFilter(name=UPSTREAM_HEADER_MUTATION_FILTER,
                       typed_config=protos.pack(_removing(SESSION_KEY_HEADER))),
        hcm.HttpFilter(name="envoy.filters.http.upstream_codec",
                       typed_config=protos.pack(upstream_codec_pb2.UpstreamCodec())),
    ])
    return hcm.HttpFilter(name="envoy.filters.http.router", typed_config=protos.pack(router))
