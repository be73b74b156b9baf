"""docker-compose.yml, Dockerfile, .dockerignore and deploy/compose/kvgate.yaml.

No Docker engine runs here: the compose file is validated against the Compose Specification's
JSON schema (the copy check-jsonschema ships), and every kvgate command, port and mount is checked
against what kvgate itself accepts (its argparse, its config loader)."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvgate.config.model import Config
from kvgate.runtime.children.etcd import embedded_etcd
from tests.deploy.deploy_support import (
    CLIENT_FILES,
    ETCD_FILES,
    REPO,
    assert_etcd_compacts,
    envoy_validate,
    host_port,
    load_mounted_config,
    load_yaml,
    make_certs,
    option,
    parse_kvgate,
    xds_cluster,
)

COMPOSE = REPO / "docker-compose.yml"
CONFIG_TARGET = "/etc/kvgate/kvgate.yaml"
KVGATE_TLS = "/etc/kvgate/etcd-tls"  # where kvgate's containers mount the etcd-tls volume


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def kvgate_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {n: s for n, s in services.items() if s.get("image", "").startswith("kvgate:")}
    assert set(found) == {"ddr-pool", "engine", "control-plane", "ext-proc-1", "ext-proc-2"}
    return found


@pytest.fixture(scope="module")
def certs(services: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the one-shot etcd-tls service writes, made by running its command here."""
    command = services["etcd-tls"]["command"]
    assert command[:3] == ["sh", "/make-etcd-certs.sh", "/tls"]
    return make_certs(tmp_path_factory.mktemp("compose") / "tls", *command[3:])


@pytest.fixture(scope="module")
def config(kvgate_services: dict[str, dict[str, Any]], certs: Path) -> Config:
    sources = {
        m["source"] for s in kvgate_services.values() for m in s.get("volumes", [])
        if isinstance(m, dict) and m["target"] == CONFIG_TARGET
    }
    assert sources == {"./deploy/compose/kvgate.yaml"}
    # raises ConfigError on any problem, the TLS files checked as the containers see them
    return load_mounted_config((REPO / "deploy/compose/kvgate.yaml").read_text(),
                               "deploy/compose/kvgate.yaml", {KVGATE_TLS: certs})


def ip_of(service: dict[str, Any]) -> str:
    return service["networks"]["kvgate"]["ipv4_address"]


def compose_schema() -> jsonschema.protocols.Validator:
    text = (resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json")
    schema = json.loads(text.read_text(encoding="utf-8"))
    return jsonschema.validators.validator_for(schema)(schema)


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    validator = compose_schema()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)
    # the schema is strict, so passing it means something
    broken = json.loads(json.dumps(compose))
    broken["services"]["envoy"]["comand"] = ["envoy"]
    assert not validator.is_valid(broken)


def test_the_stack_has_every_component(services: dict[str, dict[str, Any]]) -> None:
    assert services["envoy"]["image"].startswith("envoyproxy/envoy:v1.40")
    assert services["etcd"]["image"].startswith("quay.io/coreos/etcd:v3.5.")
    assert_etcd_compacts(services["etcd"]["command"])
    ext_procs = [n for n, s in services.items() if s.get("command", [""])[1:2] == ["ext-proc"]]
    assert len(ext_procs) == 2
    one_shot = {n for n, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"etcd-tls"}
    for name, service in services.items():
        if name not in one_shot:
            assert service.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if dependency in one_shot:  # a one-shot is done, not healthy
                assert condition == {"condition": "service_completed_successfully"}, name


def test_kvgate_ups_embedded_etcd_compacts_like_the_deployments(tmp_path: Path) -> None:
    child = embedded_etcd(tmp_path / "data", 2379, 2380, tmp_path / "etcd.log")
    assert_etcd_compacts(child.argv)


def test_every_kvgate_command_parses_with_kvgates_own_cli(
    kvgate_services: dict[str, dict[str, Any]],
) -> None:
    for name, service in kvgate_services.items():
        args = parse_kvgate(service["command"], f"docker-compose.yml: {name}")
        if hasattr(args, "config"):
            assert args.config == CONFIG_TARGET, name


def test_kvgate_services_run_unprivileged(kvgate_services: dict[str, dict[str, Any]]) -> None:
    for name, service in kvgate_services.items():
        assert service["user"].split(":")[0] not in ("0", "root"), name
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "build" in service, name


def test_healthcheck_one_liners_compile(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test", [])
        if test[:3] == ["CMD", "python", "-c"]:
            compile(test[3], f"{name} healthcheck", "exec")


def test_mounted_files_exist_in_the_repo(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = mount["source"] if isinstance(mount, dict) else mount.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).is_file(), f"{name} mounts missing {source}"


def test_commands_ports_and_addresses_match_the_mounted_config(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], config: Config
) -> None:
    subnet = ipaddress.ip_network(compose["networks"]["kvgate"]["ipam"]["config"][0]["subnet"])
    # A scaled service (the engines) has no fixed address: its replicas get theirs.
    ips = [ip_of(s) for s in services.values() if isinstance(s.get("networks"), dict)]
    assert len(ips) == len(set(ips))
    assert all(ipaddress.ip_address(ip) in subnet for ip in ips)
    etcd_endpoints = ",".join(str(e) for e in config.etcd.endpoints or ())
    for host, port in (host_port(str(e)) for e in config.etcd.endpoints or ()):
        assert host in services and f"--listen-client-urls=https://0.0.0.0:{port}" in (
            services[host]["command"])

    # control plane: admin as configured, xDS where Envoy's bootstrap looks for it
    cp = services["control-plane"]["command"]
    assert host_port(option(cp, "--admin")) == (
        config.control_plane.admin.host, config.control_plane.admin.port)
    assert option(cp, "--etcd") == etcd_endpoints
    assert config.control_plane.xds.host == "0.0.0.0"
    assert "KVGATE_ADMIN_TOKEN" in services["control-plane"]["environment"]
    assert f"127.0.0.1:{config.control_plane.admin.port}'" in (
        services["control-plane"]["healthcheck"]["test"][-1])
    assert f"127.0.0.1:{config.control_plane.admin.port}:{config.control_plane.admin.port}" in (
        services["control-plane"]["ports"])

    # ext_proc: Envoy dials config.ext_proc.address; each replica listens there
    replicas = {n: s for n, s in services.items() if s.get("command", [""])[1:2] == ["ext-proc"]}
    expected = {(ip_of(s), host_port(option(s["command"], "--listen"))[1])
                for s in replicas.values()}
    assert {(a.host, a.port) for a in config.ext_proc.addresses} == expected
    for name, service in replicas.items():
        command = service["command"]
        assert host_port(option(command, "--listen"))[0] == "0.0.0.0", name
        assert host_port(option(command, "--metrics")) == (
            config.ext_proc.metrics.host, config.ext_proc.metrics.port), name
        assert option(command, "--etcd") == etcd_endpoints, name
        assert str(host_port(option(command, "--listen"))[1]) in (
            service["healthcheck"]["test"][-1]), name

    # engines: found by the engine service's name (Compose's DNS gives each replica's address),
    # one instance each on the port the pool resolves; they join the ddr-pool service's pool
    engine, pool_host = services["engine"], services["ddr-pool"]
    args = parse_kvgate(engine["command"], "engine")
    (pool,) = config.pools
    assert pool.endpoints == () and pool.discover is not None and pool.discover.dns is not None
    assert (pool.discover.dns.name, pool.discover.dns.port) == ("engine", args.port)
    assert (args.instances, args.host) == (1, "0.0.0.0")
    assert engine["deploy"]["replicas"] >= 2 and "container_name" not in engine
    pool_args = parse_kvgate(pool_host["command"], "ddr-pool")
    assert args.pool_url == f"http://{ip_of(pool_host)}:{pool_args.pool_port}"

    # Envoy publishes the gateway listener
    assert f"{config.listener.port}:{config.listener.port}" in services["envoy"]["ports"]


def test_kvgate_reaches_etcd_over_tls_with_a_client_certificate(
    services: dict[str, dict[str, Any]], kvgate_services: dict[str, dict[str, Any]],
    config: Config, certs: Path,
) -> None:
    init = services["etcd-tls"]
    (script,) = [m for m in init["volumes"] if m["type"] == "bind"]
    assert script["source"] == "./deploy/tls/make-etcd-certs.sh"
    assert script["target"] == init["command"][1]
    (out,) = [m for m in init["volumes"] if m["type"] == "volume"]
    assert (out["source"], out["target"]) == ("etcd-tls", "/tls")
    assert init["environment"]["CLIENT_UID"] == kvgate_services["control-plane"]["user"].split(
        ":")[0]

    # etcd: client URLs over TLS, client certificates required, files from the same volume
    etcd = services["etcd"]
    command = etcd["command"]
    (mount,) = [m for m in etcd["volumes"] if isinstance(m, dict) and m["source"] == "etcd-tls"]
    assert mount["read_only"] is True
    assert "--client-cert-auth" in command
    for flag, name in (("--cert-file", "etcd.pem"), ("--key-file", "etcd-key.pem"),
                       ("--trusted-ca-file", "ca.pem")):
        assert option(command, flag) == f"{mount['target']}/{name}"
    assert option(command, "--advertise-client-urls").startswith("https://")
    assert {name for name in ETCD_FILES} <= {p.name for p in certs.iterdir()}
    # etcd's certificate names the host kvgate dials
    san = subprocess.run(["openssl", "x509", "-in", str(certs / "etcd.pem"), "-noout", "-ext",
                          "subjectAltName"], capture_output=True, text=True, check=True).stdout
    for endpoint in config.etcd.endpoints or ():
        assert f"DNS:{endpoint.host}" in san
    assert "https://127.0.0.1:2379" in " ".join(etcd["healthcheck"]["test"])

    # every kvgate service that talks to etcd mounts the volume where the config looks
    tls = config.etcd.tls
    assert tls is not None and tls.ca and tls.cert and tls.key
    assert sorted(Path(p).name for p in (tls.ca, tls.cert, tls.key)) == sorted(CLIENT_FILES)
    for name, service in kvgate_services.items():
        mounts = {m["target"]: m for m in service.get("volumes", []) if isinstance(m, dict)}
        if "--etcd=etcd:2379" in service["command"]:
            assert mounts[KVGATE_TLS]["source"] == "etcd-tls", name
            assert mounts[KVGATE_TLS]["read_only"] is True, name
            assert service["depends_on"]["etcd"] == {"condition": "service_healthy"}, name


def test_envoy_command_and_bootstrap(services: dict[str, dict[str, Any]], config: Config,
                                     tmp_path: Path) -> None:
    envoy = services["envoy"]
    command = envoy["command"]
    (mount,) = envoy["volumes"]
    assert option(command, "-c") == mount["target"]
    assert option(command, "--service-cluster") == "kvgate"
    assert option(command, "--service-node")
    bootstrap_path = REPO / mount["source"]
    bootstrap = load_yaml(bootstrap_path)
    host, port = xds_cluster(bootstrap)
    assert host == "control-plane" and host in services
    assert port == config.control_plane.xds.port
    admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
    assert f"127.0.0.1:{admin_port}:{admin_port}" in envoy["ports"]
    assert f"/dev/tcp/127.0.0.1/{admin_port}" in envoy["healthcheck"]["test"][-1]
    envoy_validate(command, bootstrap_path, "docker-compose.yml: envoy")


def test_dockerfile_builds_a_non_root_image_with_pip() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert re.findall(r"^FROM (\S+)", text, re.M)[-1] == "python:3.11-slim"
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"pip (wheel|install) .*\s\.$", text, re.M)


def test_dockerignore_lets_the_package_sources_in() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= allowed
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")
                if any(re.fullmatch(pat.replace("*", ".*"), p.parent.name) for pat in patterns)}
    assert packages and packages <= allowed, packages - allowed
