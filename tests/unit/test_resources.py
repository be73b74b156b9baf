"""Envoy resources: pure builders checked field by field, and accepted by real Envoy."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import health_check_pb2
from envoy.extensions.filters.http.buffer.v3 import buffer_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from control_plane.resources import gateway_listener, pool_cluster, route_configuration
from control_plane.resources.bootstrap import static_bootstrap, to_json
from control_plane.resources.clusters import ext_proc_cluster
from kvgate.config import load_file, load_text
from kvgate.config.model import INFERENCE_PATHS, INFERENCE_PREFIXES
from kvgate.contract.modes import RoutingMode
from kvgate.runtime.children.envoy import envoy_binary

EXAMPLE = Path(__file__).parents[2] / "examples" / "kvgate.yaml"


def _manager(mode: RoutingMode = RoutingMode.AFFINITY) -> hcm.HttpConnectionManager:
    config = load_file(EXAMPLE)
    listener = gateway_listener(config, routes=route_configuration(config, mode), mode=mode)
    manager = hcm.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    return manager


def test_filter_chain_strips_then_reads_the_body_then_asks_ext_proc_then_routes() -> None:
    manager = _manager()
    names = [f.name for f in manager.http_filters]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.buffer",  # max_request_bytes
        "envoy.filters.http.json_to_metadata",
        "kvgate.session_key",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.router",
    ]
    mutation = header_mutation_pb2.HeaderMutation()
    manager.http_filters[0].typed_config.Unpack(mutation)
    assert [m.remove for m in mutation.mutations.request_mutations] == [
        "x-gateway-destination-endpoint", "x-kvgate-pool", "x-kvgate-session-key"]
    processor = ext_proc_pb2.ExternalProcessor()
    manager.http_filters[4].typed_config.Unpack(processor)
    assert list(processor.metadata_options.forwarding_namespaces.untyped) == ["kvgate.session"]
    assert processor.failure_mode_allow
    assert list(processor.metadata_options.receiving_namespaces.untyped) == ["envoy.lb"]
    assert processor.processing_mode.response_header_mode == processor.processing_mode.SKIP
    assert processor.processing_mode.request_body_mode == processor.processing_mode.NONE
    assert processor.message_timeout.ToMilliseconds() == 200


def test_routes_hash_on_session_retry_safely_and_name_their_pool() -> None:
    route = _manager().route_config.virtual_hosts[0].routes[0]
    assert route.match.path == "/v1/chat/completions"
    # The session header, then the key Envoy's Lua filter found in the body (ext_proc's too).
    assert [(p.header.header_name, p.terminal) for p in route.route.hash_policy] == [
        ("x-session-id", True), ("x-kvgate-session-key", True)]
    assert route.route.retry_policy.retry_on == "connect-failure,refused-stream,reset"
    assert route.route.retry_policy.retry_host_predicate[0].name.endswith("previous_hosts")
    assert route.route.timeout.ToSeconds() == 0
    per_route = ext_proc_pb2.ExtProcPerRoute()
    route.typed_per_filter_config["envoy.filters.http.ext_proc"].Unpack(per_route)
    assert [(h.key, h.value) for h in per_route.overrides.grpc_initial_metadata] == [
        ("x-kvgate-pool", "coder")
    ]


@pytest.mark.parametrize("mode", list(RoutingMode))
def test_default_routes_serve_the_inference_api_and_envoy_answers_404_for_the_rest(
    mode: RoutingMode,
) -> None:
    config = load_text("pools: [{name: coder, endpoints: [10.0.0.1:8000]}]\n")
    routes = list(route_configuration(config, mode).virtual_hosts[0].routes)
    served = [(r.match.path or r.match.prefix, r.route.cluster) for r in routes[:-1]]
    assert served == [(p, "kvgate_pool_coder") for p in (*INFERENCE_PATHS, *INFERENCE_PREFIXES)]
    last = routes[-1]
    assert (last.match.prefix, last.direct_response.status) == ("/", 404)
    if mode is RoutingMode.AFFINITY:  # ext_proc is not asked (and binds nothing) for a 404
        per_route = ext_proc_pb2.ExtProcPerRoute()
        last.typed_per_filter_config["envoy.filters.http.ext_proc"].Unpack(per_route)
        assert per_route.disabled
    manager = _manager(mode)
    assert manager.normalize_path.value and manager.merge_slashes
    assert manager.path_with_escaped_slashes_action == manager.REJECT_REQUEST


def test_pool_cluster_overrides_only_from_metadata_and_never_to_unhealthy() -> None:
    cluster = pool_cluster(load_file(EXAMPLE).pools[0], eds=True)
    policy = cluster.load_balancing_policy.policies[0].typed_extension_config
    assert policy.name == "envoy.load_balancing_policies.override_host"
    override = override_host_pb2.OverrideHost()
    policy.typed_config.Unpack(override)
    sources = list(override.override_host_sources)
    assert len(sources) == 1 and not sources[0].header
    assert sources[0].metadata.key == "envoy.lb"
    fallback = override.fallback_policy.policies[0].typed_extension_config.name
    assert fallback == "envoy.load_balancing_policies.ring_hash"
    statuses = set(cluster.common_lb_config.override_host_status.statuses)
    assert statuses == {health_check_pb2.HEALTHY, health_check_pb2.UNKNOWN}


def test_baseline_modes_have_no_ext_proc() -> None:
    for mode in (RoutingMode.RING_HASH, RoutingMode.ROUND_ROBIN):
        assert "envoy.filters.http.ext_proc" not in [f.name for f in _manager(mode).http_filters]


@pytest.mark.parametrize("mode", [m for m in RoutingMode if not m.ddr_pool])
def test_real_envoy_accepts_the_bootstrap(tmp_path: Path, mode: RoutingMode) -> None:
    path = tmp_path / "envoy.json"
    path.write_text(to_json(static_bootstrap(load_file(EXAMPLE), mode=mode)))
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK" in result.stdout + result.stderr


def test_one_session_goes_to_one_ext_proc_replica_over_grpc() -> None:
    """Wherever the session was found (a header, or the key Envoy's Lua filter carries for a
    body field or the implicit key) reaches the ext_proc stream's initial metadata (as a valid
    value whatever its bytes: the carried key is percent-encoded), and the ext_proc cluster hashes
    those keys on a ring (Envoy's configuration for ext_proc session affinity); the HTTP
    transport, which has no initial metadata, keeps round robin."""
    config = load_file(EXAMPLE)
    processor = ext_proc_pb2.ExternalProcessor()
    _manager().http_filters[4].typed_config.Unpack(processor)
    sent = [(m.key, m.value) for m in processor.grpc_service.initial_metadata]
    session = config.session
    assert sent == [
        *((name, f"%REQ({name})%") for name in session.headers),
        ("x-kvgate-session-key", "%REQ(x-kvgate-session-key)%"),
    ]
    assert session.body_fields and session.implicit  # the example exercises every source
    cluster = ext_proc_cluster(config.ext_proc, [key for key, _ in sent])
    assert cluster.lb_policy == cluster_pb2.Cluster.RING_HASH
    options = http_protocol_options_pb2.HttpProtocolOptions()
    cluster.typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(options)
    assert [p.header.header_name for p in options.hash_policy] == [key for key, _ in sent]
    assert options.explicit_http_config.HasField("http2_protocol_options")
    http = replace(config.ext_proc, transport="http")
    assert ext_proc_cluster(http, [key for key, _ in sent]).lb_policy == \
        cluster_pb2.Cluster.ROUND_ROBIN


def test_local_replies_are_openai_json_and_the_body_limit_is_the_configs() -> None:
    manager = _manager()
    replies = manager.local_reply_config
    formats = [replies.body_format, *(m.body_format_override for m in replies.mappers)]
    for form in formats:
        error = form.json_format.fields["error"].struct_value.fields
        assert set(error) == {"message", "type", "code"} and error["message"].string_value
    statuses = [m.status_code.value for m in replies.mappers if m.HasField("status_code")]
    assert set(statuses) <= {503, 504}
    limit = buffer_pb2.Buffer()
    manager.http_filters[1].typed_config.Unpack(limit)
    assert limit.max_request_bytes.value == load_file(EXAMPLE).max_request_bytes == 32 << 20
