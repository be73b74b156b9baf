"""A property test: any valid config, over every key, survives dump → parse unchanged.

The dump is what `kvgate up` hands the services it starts, so a key it drops or mangles is a
setting silently lost (placement.load_gate.miss_safe once was). The generator below is the
test's own account of the YAML's keys; `test_the_generator_covers_every_key` holds it to the
schema's, so a new key cannot go untested.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.config import load_text
from kvgate.config.dump import to_yaml
from kvgate.config.model import Config
from kvgate.config.reference import DOC, render
from kvgate.config.schema import ListOf, Section, entries
from kvgate.placement.terms import TERMS
from tests.support.secure_etcd import make_pki

Draw = Callable[[st.SearchStrategy[Any]], Any]

NAME = st.from_regex(r"[a-z0-9]([a-z0-9_.-]{0,10}[a-z0-9])?", fullmatch=True)
HEADER = st.from_regex(r"x-[a-z0-9-]{1,12}", fullmatch=True)
TEXT = st.from_regex(r"[A-Za-z0-9 ._/-]{1,16}", fullmatch=True).filter(str.strip)
HOST = st.sampled_from(["127.0.0.1", "10.0.0.7", "::1", "etcd-0.example", "localhost"])
IP = st.sampled_from(["127.0.0.1", "10.0.0.7", "192.168.3.4", "::1", "fd00::5"])
URL_PATH = st.from_regex(r"/[a-z0-9/_.-]{0,12}", fullmatch=True)
BODY_FIELD = st.from_regex(r"[A-Za-z0-9_-]{1,8}(\.[A-Za-z0-9_-]{1,8}){0,3}", fullmatch=True)

# Every key the generator below writes, as a dotted path (lists as []).
GENERATED: set[str] = set()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def duration(low: float, high: float) -> st.SearchStrategy[Any]:
    """Seconds, as YAML may write them: a number, or a string with units."""
    seconds = st.floats(low, high, allow_nan=False, allow_infinity=False)
    millis = st.integers(int(low * 1000) + 1, int(high * 1000)).map(lambda ms: f"{ms}ms")
    return st.one_of(seconds, millis, seconds.map(lambda s: round(s, 3)))


def number(low: float, high: float) -> st.SearchStrategy[Any]:
    return st.one_of(st.floats(low, high, allow_nan=False, allow_infinity=False),
                     st.integers(int(low) + 1, int(high)) if high - low >= 2 else st.just(low))


def size(low: int, high: int) -> st.SearchStrategy[Any]:
    kib = st.integers(max(1, -(-low // 1024)), high // 1024).map(lambda k: f"{k}KiB")
    return st.one_of(st.integers(low, high), kib)


class Keys:
    """Draws a mapping key by key; each key drawn (or left out) is noted in GENERATED."""

    def __init__(self, draw: Draw, path: str) -> None:
        self.draw, self.path, self.data = draw, path, {}

    def add(self, key: str, strategy: st.SearchStrategy[Any], *, always: bool = False) -> Any:
        GENERATED.add(f"{self.path}.{key}" if self.path else key)
        if always or self.draw(st.booleans()):
            self.data[key] = self.draw(strategy)
            return self.data[key]
        return None


@st.composite
def configs(draw: Draw, pki: dict[str, str]) -> dict[str, Any]:
    # Above every default port, so that a key left out cannot clash with one given.
    ports = iter(draw(st.lists(st.integers(19000, 65535), min_size=8, max_size=8, unique=True)))
    top = Keys(draw, "")
    for name in ("listener", "envoy_admin"):
        top.add(name, st.fixed_dictionaries({"address": IP, "port": st.just(next(ports))}))
    plane = Keys(draw, "control_plane")
    xds, admin, metrics = next(ports), next(ports), next(ports)
    plane.add("xds", HOST.map(lambda h: _address(h, xds)))
    plane.add("admin", HOST.map(lambda h: _address(h, admin)))
    top.add("control_plane", st.just(plane.data))
    ext = Keys(draw, "ext_proc")
    first, second = next(ports), next(ports)
    ext.add("address", st.one_of(IP.map(lambda h: _address(h, first)),
                                 st.tuples(IP, IP).map(lambda hs: [_address(hs[0], first),
                                                                   _address(hs[1], second)])))
    ext.add("metrics", HOST.map(lambda h: _address(h, metrics)))
    ext.add("message_timeout", duration(0.05, 10.0))
    ext.add("transport", st.sampled_from(["grpc", "http"]))
    ext.add("max_pending_bindings", st.integers(1, 10_000_000))
    top.add("ext_proc", st.just(ext.data))
    top.add("etcd", st.just(_etcd(draw, pki)))
    top.add("session", st.just(_session(draw)))
    top.add("placement", st.just(_placement(draw)))
    disaggregation = Keys(draw, "disaggregation")
    disaggregation.add("skip_prefill_below", st.integers(0, 100_000_000))
    disaggregation.add("skip_rule", st.sampled_from(["threshold", "streams"]))
    disaggregation.add("prefill_timeout", duration(0.1, 3600.0))
    top.add("disaggregation", st.just(disaggregation.data))
    pools = _pools(draw)
    top.add("pools", st.just(pools), always=True)
    names = [pool["name"] for pool in pools]
    routes = _routes(draw, names)
    top.add("routes", st.just(routes), always=len(names) > 1)
    top.add("upstream_header", HEADER)
    top.add("max_request_bytes", size(64 * 1024, 2 * 1024**3))
    return top.data


def _etcd(draw: Draw, pki: dict[str, str]) -> dict[str, Any]:
    etcd = Keys(draw, "etcd")
    etcd.add("endpoints", st.lists(st.tuples(HOST, st.integers(1, 65535)).map(
        lambda hp: _address(*hp)), min_size=1, max_size=3))
    etcd.add("prefix", st.from_regex(r"/([a-z0-9_-]{1,8}/){0,3}", fullmatch=True))
    tls = Keys(draw, "etcd.tls")
    tls.add("ca", st.just(pki["ca"]))
    if draw(st.booleans()):  # a client certificate comes with its key
        tls.add("cert", st.just(pki["cert"]), always=True)
        tls.add("key", st.just(pki["key"]), always=True)
    GENERATED.update({"etcd.tls.cert", "etcd.tls.key"})
    etcd.add("tls", st.just(tls.data))
    auth = Keys(draw, "etcd.auth")
    auth.add("username", NAME, always=True)
    auth.add("password_file", st.just(pki["password"]))
    etcd.add("auth", st.just(auth.data))
    return etcd.data


def _session(draw: Draw) -> dict[str, Any]:
    session = Keys(draw, "session")
    session.add("headers", st.lists(HEADER, min_size=1, max_size=3))
    session.add("idle_ttl", duration(2.0, 30 * 86400.0))
    session.add("body_fields", st.lists(BODY_FIELD, max_size=3))
    session.add("implicit", st.sampled_from([True, False, "on", "off"]))
    session.add("body_limit", size(1024, 64 * 1024 * 1024))
    session.add("max_bindings", st.integers(0, 1_000_000_000))
    return session.data


def _placement(draw: Draw) -> dict[str, Any]:
    placement = Keys(draw, "placement")
    placement.add("load_factor", number(1.0, 100.0))
    gate = Keys(draw, "placement.load_gate")
    gate.add("enabled", st.booleans())
    gate.add("min_saving_s", duration(0.0, 3600.0))
    gate.add("min_saving_ratio", number(0.0, 1.0))
    gate.add("cooldown_s", duration(0.0, 86400.0))
    gate.add("candidates", st.integers(1, 1024))
    gate.add("miss_safe", st.booleans())
    gate.add("prefix_placement", st.booleans())
    gate.add("book_uncached_prefill", st.booleans())
    gate.add("board_from_reports", st.booleans())
    gate.add("hbm_estimate", st.sampled_from(["none", "routed"]))
    gate.add("prefix_index_blocks", st.integers(1, 1 << 24))
    gate.add("prefix_block_tokens", st.integers(1, 4096))
    gate.add("terms", st.lists(st.sampled_from(sorted(TERMS)), min_size=1, max_size=len(TERMS),
                               unique=True))
    source = gate.add("source", st.sampled_from(["scrape", "collector"]))
    if source == "collector":  # KV events: one port, or an offset, read by the collector
        if draw(st.booleans()):
            events = gate.add("kv_events_port", st.integers(0, 65535))
            GENERATED.add("placement.load_gate.kv_events_port_offset")
        else:
            events = gate.add("kv_events_port_offset", st.integers(-65535, 65535))
            GENERATED.add("placement.load_gate.kv_events_port")
        if events:  # a replay socket only beside a publisher
            gate.add("kv_events_replay_offset", st.integers(-65535, 65535))
        else:
            GENERATED.add("placement.load_gate.kv_events_replay_offset")
    else:
        GENERATED.update(f"placement.load_gate.{k}" for k in (
            "kv_events_port", "kv_events_port_offset", "kv_events_replay_offset"))
    gate.add("collector", st.lists(st.builds(_address, HOST, st.integers(1, 65535)),
                                   max_size=3))
    refresh = draw(st.floats(0.01, 60.0, allow_nan=False))
    gate.add("refresh_s", st.just(refresh), always=True)
    gate.add("max_load_age_s", st.floats(refresh, 3600.0, allow_nan=False), always=True)
    gate.add("bytes_per_token", number(0.1, 1000.0))
    placement.add("load_gate", st.just(gate.data))
    cost = Keys(draw, "placement.engine_cost")
    cost.add("prefill_tokens_per_s", number(1.0, 1e9))
    cost.add("prefill_overhead_s", duration(0.0, 600.0))
    cost.add("kv_bytes_per_token", size(1, 1 << 30))
    cost.add("ddr_gbps", number(0.001, 1e6))
    cost.add("node_gbps", number(0.0, 1e6))
    cost.add("transfer_fixed_ms", number(0.0, 60_000.0))
    cost.add("prompt_us_per_token", number(0.0, 1e6))
    cost.add("hbm_tokens", st.integers(1, 1 << 40))
    cost.add("pool_load", st.sampled_from(["async", "in_step"]))
    placement.add("engine_cost", st.just(cost.data))
    return placement.data


def _pools(draw: Draw) -> list[dict[str, Any]]:
    names = draw(st.lists(NAME, min_size=1, max_size=3, unique=True))
    addresses = iter(draw(st.lists(st.tuples(IP, st.integers(1, 65535)).map(
        lambda hp: _address(*hp)), min_size=4 * len(names), max_size=4 * len(names),
        unique_by=lambda a: a.replace("[", "").replace("]", ""))))
    pools = []
    for name in names:
        pool = Keys(draw, "pools[]")
        pool.add("name", st.just(name), always=True)
        pool.add("kv_pool", NAME)
        endpoints = []
        for _ in range(draw(st.integers(1, 4))):
            address = next(addresses)
            if draw(st.booleans()):
                endpoints.append(address)
                continue
            endpoint = Keys(draw, "pools[].endpoints[]")
            endpoint.add("address", st.just(address), always=True)
            endpoint.add("kv_pool", NAME)
            endpoint.add("weight", st.integers(1, 128))
            # Prefill engines take a pool with an engine that decodes and the gRPC transport
            # (tests/unit/test_pd_roles.py); the others are valid anywhere.
            endpoint.add("role", st.sampled_from(["both", "decode"]))
            endpoints.append(endpoint.data)
        pool.add("endpoints", st.just(endpoints), always=True)
        health = Keys(draw, "pools[].health")
        health.add("path", URL_PATH)
        interval = draw(st.floats(0.05, 3600.0, allow_nan=False))
        health.add("interval", st.just(interval), always=True)
        health.add("timeout", st.floats(0.01, min(interval, 600.0), allow_nan=False),
                   always=True)  # its default (1s) may exceed a short interval
        health.add("unhealthy_threshold", st.integers(1, 100))
        health.add("healthy_threshold", st.integers(1, 100))
        health.add("max_failed_fraction", number(0.0, 1.0))
        pool.add("health", st.just(health.data))
        pool.add("discover", st.just(_discover(draw)))
        pools.append(pool.data)
    return pools


ROLES = st.sampled_from(["both", "prefill", "decode"])


def _discover(draw: Draw) -> dict[str, Any]:
    discover = Keys(draw, "pools[].discover")
    dns = Keys(draw, "pools[].discover.dns")
    srv = draw(st.booleans())
    dns.add("name", st.just("_http._tcp.engines.svc" if srv else "engines.default.svc"),
            always=True)
    dns.add("port", st.integers(1, 65535), always=not srv)
    dns.add("every", duration(0.1, 3600))
    dns.add("server", st.tuples(IP, st.integers(1, 65535)).map(lambda a: _address(*a)))
    etcd = Keys(draw, "pools[].discover.etcd")
    for source in (dns, etcd):
        source.add("kv_pool", NAME)
        source.add("weight", st.integers(1, 128))
        source.add("role", ROLES)
    discover.add("dns", st.just(dns.data), always=True)
    discover.add("etcd", st.just(etcd.data))
    discover.add("drain", duration(0, 7 * 86400))
    discover.add("misses", st.integers(1, 100))
    return discover.data


def _routes(draw: Draw, pools: list[str]) -> list[dict[str, Any]]:
    routes = []
    for _ in range(draw(st.integers(1, 3))):
        route = Keys(draw, "routes[]")
        match = Keys(draw, "routes[].match")
        if draw(st.booleans()):
            match.add("prefix", URL_PATH)
        else:
            match.add("path", URL_PATH)
        GENERATED.update({"routes[].match.prefix", "routes[].match.path"})
        match.add("headers", st.dictionaries(HEADER, TEXT, max_size=2))
        route.add("match", st.just(match.data), always=True)
        route.add("pool", st.sampled_from(pools), always=True)
        route.add("timeout", duration(0.0, 86400.0))
        routes.append(route.data)
    return routes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("pki")
    made = make_pki(directory)
    (directory / "password").write_text("secret\n")
    return {"ca": str(made.ca), "cert": str(made.client_cert), "key": str(made.client_key),
            "password": str(directory / "password")}


# ~18 s of CPU for 150 configs: past the default 120 s once on a machine loaded nine times over.
@pytest.mark.timeout(360)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_valid_config_survives_dump_and_parse(
    data: st.DataObject, pki: dict[str, str]
) -> None:
    written = data.draw(configs(pki))
    config = load_text(yaml.safe_dump(written), base=Path("/"))
    assert load_text(to_yaml(config), base=Path("/")) == config


def _schema_keys(cls: type = Config, prefix: str = "") -> set[str]:
    keys = set()
    for entry in entries(cls):
        path = f"{prefix}{entry.name}"
        kind = entry.key.kind
        item = kind.item if isinstance(kind, ListOf) else None
        if isinstance(kind, Section):
            keys |= _schema_keys(kind.cls, f"{path}.")
        elif isinstance(item, Section):
            keys |= _schema_keys(item.cls, f"{path}[].")
        else:
            keys.add(path)
    return keys


def test_the_generator_covers_every_key(pki: dict[str, str]) -> None:
    @settings(max_examples=1, database=None)
    @given(st.data())
    def draw_one(data: st.DataObject) -> None:  # fills GENERATED
        data.draw(configs(pki))

    draw_one()
    leaves = {key for key in GENERATED
              if not any(other.startswith((f"{key}.", f"{key}[].")) for other in GENERATED)}
    assert _schema_keys() == leaves


def test_the_configuration_reference_is_current() -> None:
    assert DOC.read_text() == render(), "run: python -m kvgate.config.reference"
