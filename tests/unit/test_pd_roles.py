"""Endpoint roles (prefill/decode-disaggregated pools): config, records, membership views, EDS."""

from __future__ import annotations

import pytest

from control_plane.resources.endpoints import load_assignment
from kvgate.config import load_text
from kvgate.config.dump import to_yaml
from kvgate.config.errors import ConfigError
from kvgate.contract.states import EndpointState, Role
from kvgate.endpoints.directory import EndpointDirectory
from kvgate.endpoints.records import EndpointRecord

PD = """
pools:
  - name: coder
    endpoints:
      - {address: 10.0.0.1:8000, role: prefill}
      - {address: 10.0.0.2:8000, role: decode}
      - {address: 10.0.0.3:8000, role: prefill}
      - 10.0.0.4:8000
"""


def test_roles_read_default_and_round_trip() -> None:
    config = load_text(PD)
    roles = [ep.role for ep in config.pools[0].endpoints]
    assert roles == [Role.PREFILL, Role.DECODE, Role.PREFILL, Role.BOTH]
    assert load_text(to_yaml(config)) == config


@pytest.mark.parametrize(("text", "message"), [
    ("pools: [{name: a, endpoints: [{address: 10.0.0.1:1, role: prefil}]}]\n",
     "pools[0].endpoints[0].role: must be one of both, prefill, decode, got 'prefil'"),
    ("pools: [{name: a, endpoints: [{address: 10.0.0.1:1, role: prefill},"
     " {address: 10.0.0.2:1, role: prefill}]}]\n",
     "pools[0].endpoints: pool 'a' has prefill engines (first at endpoints[0]) but no engine "
     "that decodes"),
])
def test_bad_roles_say_what_and_where(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    assert message in caught.value.render()


def test_a_pool_of_decode_engines_alone_is_valid() -> None:
    config = load_text("pools: [{name: a, endpoints: [{address: 10.0.0.1:1, role: decode}]}]\n")
    assert config.pools[0].endpoints[0].role is Role.DECODE


def test_records_carry_the_role_and_old_records_read_as_both() -> None:
    record = EndpointRecord("coder", "10.0.0.1:8000", "kv", role=Role.PREFILL)
    assert EndpointRecord.decode("coder", "10.0.0.1:8000", record.encode()) == record
    colocated = EndpointRecord("coder", "10.0.0.4:8000", "kv")
    assert b"role" not in colocated.encode()  # colocated records keep their old shape
    assert EndpointRecord.decode("coder", "10.0.0.4:8000", colocated.encode()).role is Role.BOTH
    with pytest.raises(ValueError, match="unknown endpoint role"):
        EndpointRecord.decode("coder", "x", b'{"kv_pool": "kv", "role": "encode"}')


def test_placement_never_sees_a_prefill_engine() -> None:
    directory = EndpointDirectory(load_text(PD))
    assert [m.address for m in directory.view("coder").members] == [
        "10.0.0.2:8000", "10.0.0.4:8000"]
    assert [m.address for m in directory.prefillers("coder")] == [
        "10.0.0.1:8000", "10.0.0.3:8000"]
    assert set(directory.active_addresses()) == {f"10.0.0.{i}:8000" for i in range(1, 5)}
    # From etcd's records: a failed prefill engine is no longer offered.
    for ep in load_text(PD).pools[0].endpoints:
        directory.set_record(EndpointRecord("coder", ep.key, ep.kv_pool, role=ep.role,
                                            healthy=ep.key != "10.0.0.1:8000"))
    assert [m.address for m in directory.prefillers("coder")] == ["10.0.0.3:8000"]
    assert [m.address for m in directory.view("coder").active] == [
        "10.0.0.2:8000", "10.0.0.4:8000"]
    assert directory.states()["coder"]["10.0.0.1:8000"] is EndpointState.FAILED


def test_envoy_is_never_given_a_prefill_engine() -> None:
    assignment = load_assignment(load_text(PD).pools[0])
    ports = [(e.endpoint.address.socket_address.address)
             for e in assignment.endpoints[0].lb_endpoints]
    assert ports == ["10.0.0.2", "10.0.0.4"]
