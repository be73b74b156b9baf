"""Config: strict parsing, every error with its field path, defaults, round trip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.config import ConfigError, load_file, load_text
from kvgate.config.dump import to_yaml

EXAMPLE = Path(__file__).parents[2] / "examples" / "kvgate.yaml"

BAD = [
    ("pools:\n  - name: a\n    endpoints: [10.0.0.1:8000, 10.0.0.2:8000, 10.0.0.3:70000]\n",
     "pools[0].endpoints[2]: port must be 1..65535, got 70000"),
    ("listener: {port: 8080, adress: 1.2.3.4}\n",
     "listener.adress: unknown key (allowed here: address, port)"),
    ("bogus: 1\n", "bogus: unknown key"),
    ("pools:\n  - name: a\n    endpoints: [localhost:8000]\n",
     "pools[0].endpoints[0]: must be an IP address and port"),
    ("session: {idle_ttl: soon}\n", "session.idle_ttl: must be a duration like"),
    ("session: {idle_ttl: 1s}\n", "session.idle_ttl: must be between 2s and"),
    ("session: {headers: [x-gateway-destination-endpoint]}\n",
     "session.headers[0]: 'x-gateway-destination-endpoint' cannot carry a session id"),
    ("placement: {load_factor: 0.5}\n", "placement.load_factor: must be between 1.0 and 100.0"),
    ("etcd: {prefix: kvgate}\n", "etcd.prefix: must start and end with '/'"),
    ("pools:\n  - {name: a, endpoints: [10.0.0.1:1]}\n  - {name: a, endpoints: [10.0.0.2:1]}\n"
     "routes: [{pool: a}]\n", "pools[1].name: duplicate pool name 'a'"),
    ("pools:\n  - {name: a, endpoints: [10.0.0.1:1]}\n  - {name: b, endpoints: [10.0.0.1:1]}\n"
     "routes: [{pool: a}]\n", "pools[1].endpoints[0]: endpoint 10.0.0.1:1 listed twice"),
    ("pools:\n  - {name: a, endpoints: [10.0.0.1:1]}\nroutes: [{pool: b}]\n",
     "routes[0].pool: unknown pool 'b' (pools: a)"),
    ("pools:\n  - {name: a, endpoints: [10.0.0.1:1]}\n  - {name: b, endpoints: [10.0.0.2:1]}\n",
     "routes: required when more than one pool is defined"),
    ("routes: [{match: {prefix: v1}, pool: a}]\npools: [{name: a, endpoints: [10.0.0.1:1]}]\n",
     "routes[0].match.prefix: must start with '/'"),
    ("pools: [{name: a, endpoints: [{address: 10.0.0.1:1, weight: 0}]}]\n",
     "pools[0].endpoints[0].weight: must be 1..128, got 0"),
    ("pools: [{name: a, endpoints: []}]\n", "pools[0].endpoints: required: at least one endpoint"),
    ("pools: [{name: a, endpoints: [10.0.0.1:1], health: {interval: 1s, timeout: 2s}}]\n",
     "pools[0].health.timeout: must not exceed health.interval"),
    ("listener: {port: 9901}\n", "envoy_admin: 127.0.0.1:9901 is already used by listener"),
    ("listener: [1, 2]\n", "listener: must be a mapping, got a list"),
    ("pools: {name: a}\n", "pools: must be a list, got a mapping"),
    ("listener: {port: 8080\n", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_each_bad_file_names_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text, source="k.yaml")
    assert expected in caught.value.render(), caught.value.render()
    assert caught.value.render().startswith("k.yaml: line ")


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        load_text("listener: {port: 0}\nenvoy_admin: {port: 99999}\nnope: 1\n")
    assert len(caught.value.problems) == 3


def test_example_loads_and_round_trips() -> None:
    config = load_file(EXAMPLE)
    assert config.pools[0].endpoints[2].kv_pool == "memcache-b"
    assert config.pools[0].endpoints[2].weight == 2
    assert config.pools[0].endpoints[0].kv_pool == "memcache-a"
    assert config.session.idle_ttl == 3600
    assert load_text(to_yaml(config)) == config


def test_defaults_and_single_pool_default_route() -> None:
    config = load_text("pools: [{name: coder, endpoints: ['[::1]:8000', 10.0.0.1:8000]}]\n")
    assert config.listener.port == 8080 and config.envoy_admin.port == 9901
    assert config.ext_proc.addresses[0].port == 9002
    assert config.control_plane.admin.port == 18001
    assert config.etcd.endpoints is None and config.etcd.prefix == "/kvgate/v1/"
    assert [(r.match.prefix, r.pool) for r in config.routes] == [("/", "coder")]
    assert config.pools[0].endpoints[0].key == "[::1]:8000"
    assert config.pools[0].kv_pool == "coder"


def test_check_config_command(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [{name: a, endpoints: [10.0.0.1:0]}]\n")
    result = subprocess.run(
        [sys.executable, "-m", "kvgate_cli", "check-config", str(bad)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1
    assert "pools[0].endpoints[0]: port must be 1..65535, got 0" in result.stderr
    good = subprocess.run(
        [sys.executable, "-m", "kvgate_cli", "check-config", str(EXAMPLE)],
        capture_output=True, text=True, check=False,
    )
    assert good.returncode == 0 and good.stdout.startswith("OK")


def test_up_engines_flag_builds_one_pool() -> None:
    from kvgate.config import Config
    from kvgate_cli.up.command import with_engines

    config = with_engines(Config(), "http://10.0.0.1:8000, 10.0.0.2:8001")
    assert [e.key for e in config.pools[0].endpoints] == ["10.0.0.1:8000", "10.0.0.2:8001"]
    assert [(r.match.prefix, r.pool) for r in config.routes] == [("/", "default")]
    with pytest.raises(ConfigError) as caught:
        with_engines(Config(), "10.0.0.1:8000,engine-b:8000")
    assert "--engines: line" in caught.value.render()
    assert "pools[0].endpoints[1]: must be an IP address and port" in caught.value.render()
