"""Config: strict parsing, every error with its field path, defaults, round trip."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvgate.config import Config, ConfigError, load_file, load_text
from kvgate.config.dump import to_yaml
from kvgate.config.errors import format_path
from kvgate.config.flags import with_engines
from kvgate.config.load import check_file, check_text
from kvgate.config.model import inference_routes

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
        load_text("listener: {port: 0}\nenvoy_admin: {port: 99999}\nnope: 1\n"
                  "pools: [{name: a, endpoints: [10.0.0.1:1]}]\n")
    assert len(caught.value.problems) == 3


def test_field_and_cross_field_problems_in_one_run() -> None:
    text = (
        "listener: {port: 0}\n"
        "pools:\n"
        "  - {name: a, endpoints: [10.0.0.1:1, 10.0.0.1:1]}\n"
        "  - {name: b, endpoints: [10.0.0.2:1], health: {interval: 1s, timeout: 2s}}\n"
        "routes: [{pool: a}, {pool: nowhere}]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_text(text, source="k.yaml")
    lines = caught.value.render().splitlines()
    assert lines == [
        "k.yaml: line 1: listener.port: port must be 1..65535, got 0",
        "k.yaml: line 3: pools[0].endpoints[1]: endpoint 10.0.0.1:1 listed twice "
        "(first at pools[0].endpoints[0])",
        "k.yaml: line 4: pools[1].health.timeout: must not exceed health.interval",
        "k.yaml: line 5: routes[1].pool: unknown pool 'nowhere' (pools: a, b)",
    ]


def test_a_field_replaced_by_its_default_causes_no_second_problem() -> None:
    # listener.port is bad, so its default (8080) stands in: not a clash with the ext_proc port.
    text = ("listener: {port: 0}\next_proc: {metrics: 127.0.0.1:8080}\n"
            "pools: [{name: a, endpoints: [10.0.0.1:1]}]\n")
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    assert [str(p) for p in caught.value.problems] == [
        "line 1: listener.port: port must be 1..65535, got 0"
    ]


def test_duplicate_keys_rejected_with_both_lines() -> None:
    text = ("listener: {port: 8080}\n"
            "pools:\n"
            "  - name: a\n"
            "    endpoints: [10.0.0.1:1]\n"
            "    name: b\n"
            "listener: {port: 8081}\n")
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    assert [str(p) for p in caught.value.problems] == [
        "line 5: pools[0].name: duplicate key 'name' (also at line 3; YAML would silently "
        "keep the last)",
        "line 6: listener: duplicate key 'listener' (also at line 1; YAML would silently "
        "keep the last)",
    ]


def test_merge_keys_may_be_overridden() -> None:
    text = ("health: &h {interval: 2s, timeout: 1s}\n"
            "pools: [{name: a, endpoints: [10.0.0.1:1], health: {<<: *h, timeout: 500ms}}]\n")
    with pytest.raises(ConfigError) as caught:  # only the unknown top-level key is a problem
        load_text(text)
    assert [str(p) for p in caught.value.problems] == [
        "line 1: health: unknown key (allowed here: listener, envoy_admin, control_plane, "
        "ext_proc, etcd, session, placement, disaggregation, pools, routes, upstream_header, "
        "max_request_bytes)"
    ]


@pytest.mark.parametrize(("text", "expected"), [
    ("", "line 1: (top level): the file is empty"),
    ("# only a comment\n", "line 1: (top level): the file is empty"),
    ("pools: []\n", "line 1: pools: at least one pool with endpoints is required"),
    ("listener: {port: 8080}\n", "line 1: pools: at least one pool with endpoints is required"),
])
def test_empty_config_and_no_pools_rejected(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    assert str(caught.value.problems[0]).startswith(expected), caught.value.render()


def test_kvgate_up_may_leave_pools_out() -> None:
    assert load_text("listener: {port: 8081}\n", require_pools=False).pools == ()


@pytest.mark.parametrize(("text", "line"), [
    ("a: " + "[" * 5000 + "\n", 1),
    ("a:\n" + "".join(" " * i + "- \n" for i in range(2000)), 33),
    ("a: " + "{b: " * 3000 + "\n", 1),
])
def test_deep_nesting_is_a_problem_not_a_traceback(text: str, line: int) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text, source="k.yaml")
    assert caught.value.render().startswith(f"k.yaml: line {line}: (top level): not valid YAML: "
                                            "nested deeper than 32 levels")


@pytest.mark.parametrize(("text", "expected"), [
    ("x: 2001-13-45\n", "line 1: (top level): not valid YAML: cannot read the value "
     "'2001-13-45': month must be in 1..12"),
    ("x: " + "9" * 5000 + "\n", "line 1: (top level): not valid YAML: cannot read the value"),
    ("x: !!python/object:os.system 1\n", "line 1: (top level): not valid YAML: could not "
     "determine a constructor"),
    ("a: \x00\n", "line 1: (top level): not valid YAML: character U+0000 is not allowed"),
    ("a: 1\n---\nb: 2\n", "line 2: (top level): not valid YAML: expected a single document"),
])
def test_values_yaml_cannot_build_are_problems(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    assert str(caught.value.problems[0]).startswith(expected), caught.value.render()


POOL = "pools: [{name: a, endpoints: [10.0.0.1:1]}]\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("pools: [{name: a, endpoints: [10.0.0.1:1], health: {path: \"/health\\r\\nX-A: 1\"}}]\n",
     "pools[0].health.path: must not contain control characters, found '\\r' at position 7"),
    ("pools: [{name: a, endpoints: [10.0.0.1:1], health: {path: /he alth}}]\n",
     "pools[0].health.path: must not contain spaces or '#'"),
    (POOL + "routes: [{match: {prefix: \"/v1/\\n\"}, pool: a}]\n",
     "routes[0].match.prefix: must not contain control characters"),
    (POOL + "routes: [{match: {prefix: /v1/, headers: {x-t: \"a\\r\\nb\"}}, pool: a}]\n",
     "routes[0].match.headers.x-t: must not contain control characters"),
    (POOL + "routes: [{match: {path: '/v1/x?y=1'}, pool: a}]\n",
     "routes[0].match.path: must not contain spaces, '?' or '#'"),
    (POOL + "routes: [{match: {path: /v1/x, prefix: /v1/}, pool: a}]\n",
     "routes[0].match.path: give either prefix or path, not both"),
    (POOL + "session: {headers: [\"x-a\\tb\"]}\n",
     "session.headers[0]: must not contain control characters"),
])
def test_control_characters_and_bad_paths_rejected(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(text)
    assert expected in caught.value.render(), caught.value.render()


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("https://10.0.0.1:8000", "https:// is not supported: kvgate connects to this address in "
     "plain text, without TLS"),
    ("grpc://10.0.0.1:8000", "grpc:// is not supported"),
    ("http://10.0.0.1:8000/v1", "must be host:port, without a path"),
    ("10.0.0.1:８０", "must be host:port"),
    ("10.0.0.1:" + "9" * 40, "port must be 1..65535, got 999999999999..."),
])
def test_engine_urls_other_than_plain_http_rejected(endpoint: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(f"pools: [{{name: a, endpoints: ['{endpoint}']}}]\n")
    assert f"pools[0].endpoints[0]: {expected}" in caught.value.render(), caught.value.render()


def test_plain_http_engine_urls_accepted() -> None:
    config = load_text("pools: [{name: a, endpoints: ['http://10.0.0.1:8000/']}]\n")
    assert config.pools[0].endpoints[0].key == "10.0.0.1:8000"


def test_non_loopback_admin_xds_and_envoy_admin_warn() -> None:
    text = ("envoy_admin: {address: 0.0.0.0, port: 9901}\n"
            "control_plane: {xds: 0.0.0.0:18000, admin: '10.1.2.3:18001'}\n"
            "listener: {address: 0.0.0.0, port: 8080}\n" + POOL)
    checked = check_text(text)
    assert [(w.line, format_path(w.path)) for w in checked.warnings] == [
        (1, "envoy_admin.address"), (2, "control_plane.admin"), (2, "control_plane.xds"),
    ]
    assert "0.0.0.0 is not loopback: Envoy's admin interface" in str(checked.warnings[0])
    assert check_text(POOL).warnings == ()


def test_message_timeout_and_the_etcd_write_deadline_go_together() -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(POOL + "ext_proc: {message_timeout: 10ms}\n")
    assert ("ext_proc.message_timeout: must be at least 50ms, got '10ms': a new session's etcd "
            "write gets half of it") in caught.value.render()
    assert load_text(POOL + "ext_proc: {message_timeout: 60ms}\n").ext_proc \
        .etcd_write_deadline == pytest.approx(0.03)
    assert load_text(POOL).ext_proc.etcd_write_deadline == pytest.approx(0.1)
    assert load_text(POOL + "ext_proc: {message_timeout: 2s}\n").ext_proc \
        .etcd_write_deadline == pytest.approx(0.1)
    # One more try on the next member, inside Envoy's wait.
    assert load_text(POOL + "ext_proc: {message_timeout: 60ms}\n").ext_proc \
        .etcd_write_budget == pytest.approx(0.045)
    assert load_text(POOL).ext_proc.etcd_write_budget == pytest.approx(0.15)
    assert load_text(POOL + "ext_proc: {message_timeout: 5s}\n").ext_proc \
        .etcd_write_budget == pytest.approx(1.0)


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
    assert config.routes == inference_routes("coder")
    assert {r.match.path for r in config.routes} >= {"/v1/chat/completions", "/v1/models"}
    assert not any(r.match.path is None and r.match.prefix in ("/", "/v1/") for r in config.routes)
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
    config = with_engines(Config(), "http://10.0.0.1:8000, 10.0.0.2:8001")
    assert [e.key for e in config.pools[0].endpoints] == ["10.0.0.1:8000", "10.0.0.2:8001"]
    assert config.routes == inference_routes("default")


@pytest.mark.parametrize(("engines", "expected"), [
    ("10.0.0.1:8000,http://localhost:8101", "--engines: must be an IP address and port (Envoy "
     "does not resolve names here (write 127.0.0.1)), got 'http://localhost:8101'"),
    ("https://10.0.0.1:8000", "--engines: https:// is not supported"),
    ("10.0.0.1:8000,http://10.0.0.1:8000", "--engines: engine 10.0.0.1:8000 given twice "
     "('http://10.0.0.1:8000')"),
    (" , ", "--engines: no engine given"),
])
def test_up_engines_flag_errors_name_the_flag_and_the_url(engines: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        with_engines(Config(), engines)
    assert caught.value.render() == expected or caught.value.render().startswith(expected), \
        caught.value.render()
    assert "line" not in caught.value.render()


def test_check_config_reads_with_bounds(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_file("/dev/zero")
    assert "the file is larger than 1024 KiB" in caught.value.render()
    with pytest.raises(ConfigError) as caught:
        load_file(tmp_path)
    assert "cannot read the file: it is a directory" in caught.value.render()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as caught:  # nobody ever writes to it
        check_file(fifo, wait=0.2)
    assert "the file did not end within 0.2s" in caught.value.render()
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"pools:\n  - \xff\xfe\n")
    with pytest.raises(ConfigError) as caught:
        load_file(binary)
    assert str(caught.value.problems[0]) == "line 2: (top level): not UTF-8 text (byte 0xff)"


def test_check_config_reads_a_fifo_someone_writes(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as out:
            out.write(EXAMPLE.read_text())

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert check_file(fifo, wait=30).config == load_file(EXAMPLE)
    finally:
        writer.join()


def test_ext_proc_transport_is_grpc_or_http() -> None:
    assert load_text(POOL).ext_proc.transport == "grpc"
    assert load_text(POOL + "ext_proc: {transport: http}\n").ext_proc.transport == "http"
    with pytest.raises(ConfigError) as caught:
        load_text(POOL + "ext_proc: {transport: HTTP2}\n")
    assert "ext_proc.transport: must be one of grpc, http, got 'HTTP2'" in caught.value.render()
