"""The opt-in upstream header: YAML key, its dump, and the route table Envoy gets."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2

from control_plane.resources import route_configuration
from kvgate.config import ConfigError, load_text
from kvgate.config.dump import to_yaml
from kvgate.contract.modes import RoutingMode

POOL = "pools: [{name: coder, endpoints: [127.0.0.1:8000]}]\n"


def test_off_by_default_so_no_internal_address_reaches_clients() -> None:
    config = load_text(POOL)
    assert config.upstream_header is None
    for mode in RoutingMode:
        assert list(route_configuration(config, mode).response_headers_to_add) == []


def test_named_header_carries_envoys_upstream_host_replacing_the_engines_own() -> None:
    config = load_text(POOL + "upstream_header: X-Kvgate-Upstream\n")
    assert config.upstream_header == "x-kvgate-upstream"
    assert load_text(to_yaml(config)).upstream_header == "x-kvgate-upstream"
    (added,) = route_configuration(config).response_headers_to_add
    assert (added.header.key, added.header.value) == ("x-kvgate-upstream", "%UPSTREAM_HOST%")
    assert added.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


@pytest.mark.parametrize("value", ["", None])
def test_empty_or_null_means_off(value: str | None) -> None:
    text = POOL + ("upstream_header:\n" if value is None else "upstream_header: ''\n")
    assert load_text(text).upstream_header is None


@pytest.mark.parametrize(("value", "expected"), [
    ("'bad header'", "upstream_header: not a valid HTTP header name"),
    ("x-gateway-destination-endpoint", "upstream_header: 'x-gateway-destination-endpoint' "
                                       "cannot name the upstream"),
    ("[a, b]", "upstream_header: "),
])
def test_bad_names_are_rejected_with_the_field(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(POOL + f"upstream_header: {value}\n")
    assert expected in caught.value.render()
