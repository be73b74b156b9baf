"""`pools[].discover`: read strictly, every problem at its field path, dumped and read back."""

from __future__ import annotations

import pytest

from kvgate.config import ConfigError, load_text
from kvgate.config.address import HostPort
from kvgate.config.dump import to_yaml
from kvgate.contract.states import Role

BOTH = """
pools:
  - name: coder
    kv_pool: a
    endpoints: [10.0.0.1:8000]
    discover:
      dns: {name: engines.default.svc, port: 8000, every: 2s, server: "127.0.0.1:5353",
            kv_pool: b, weight: 2, role: decode}
      etcd: {role: prefill}
      drain: 30s
      misses: 2
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    return [f"{'.'.join(map(str, p.path))}: {p.message}" for p in caught.value.problems]


def test_both_sources_beside_endpoints() -> None:
    pool = load_text(BOTH).pools[0]
    assert pool.discover is not None and pool.discover.dns is not None
    dns = pool.discover.dns
    assert (dns.name, dns.port, dns.every, dns.server) == (
        "engines.default.svc", 8000, 2.0, HostPort("127.0.0.1", 5353))
    assert (dns.kv_pool, dns.weight, dns.role) == ("b", 2, Role.DECODE)
    assert pool.discover.etcd is not None and pool.discover.etcd.role is Role.PREFILL
    assert (pool.discover.drain, pool.discover.misses) == (30.0, 2)
    assert len(pool.endpoints) == 1


def test_discover_alone_and_defaults() -> None:
    pool = load_text("pools: [{name: coder, discover: {etcd: {}}}]").pools[0]
    assert pool.endpoints == ()
    assert pool.discover is not None and pool.discover.dns is None
    etcd = pool.discover.etcd
    assert etcd is not None and (etcd.kv_pool, etcd.weight, etcd.role) == (None, None, None)
    assert (pool.discover.drain, pool.discover.misses) == (300.0, 3)


def test_srv_name_needs_no_port() -> None:
    pool = load_text("pools: [{name: c, discover: {dns: {name: _http._tcp.engines}}}]").pools[0]
    assert pool.discover is not None and pool.discover.dns is not None
    assert pool.discover.dns.port is None


def test_round_trip() -> None:
    config = load_text(BOTH)
    assert load_text(to_yaml(config)) == config


@pytest.mark.parametrize(("text", "expected"), [
    ("pools: [{name: c}]", "pools.0.endpoints: required: at least one endpoint (or `discover:`)"),
    ("pools: [{name: c, discover: {}}]", "pools.0.discover: names no source"),
    ("pools: [{name: c, discover: {dns: {port: 80}}}]", "pools.0.discover.dns.name: required"),
    ("pools: [{name: c, discover: {dns: {name: e}}}]", "pools.0.discover.dns.port: required"),
    ("pools: [{name: c, discover: {dns: {name: e, port: 1, ttl: 1}}}]",
     "pools.0.discover.dns.ttl: unknown key"),
    ("pools: [{name: c, discover: {dns: {name: 'a b', port: 1}}}]",
     "pools.0.discover.dns.name: not a valid DNS name"),
    ("pools: [{name: c, discover: {dns: {name: e, port: 1, server: 'dns:53'}}}]",
     "pools.0.discover.dns.server: must be a DNS server's ip:port"),
    ("pools: [{name: c, discover: {etcd: {role: both-ways}}}]",
     "pools.0.discover.etcd.role: must be one of both, prefill, decode"),
    ("pools: [{name: c, discover: {etcd: {kv_pool: A}}}]", "pools.0.discover.etcd.kv_pool"),
    ("pools: [{name: c, discover: {etcd: {}, misses: 0}}]", "pools.0.discover.misses"),
    ("pools: [{name: c, discover: [dns]}]", "pools.0.discover: must be a mapping"),
])
def test_problems_name_their_field(text: str, expected: str) -> None:
    problems = _problems(text)
    assert any(p.startswith(expected) for p in problems), problems
    assert len(problems) == 1, problems
