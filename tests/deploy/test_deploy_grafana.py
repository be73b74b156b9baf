"""deploy/grafana/kvgate-dashboard.json: loads, and every panel queries metrics that kvgate or
vLLM (as the emulator reproduces vLLM's names) really export."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from emulator.ddr_pool import DdrPool
from emulator.engine_model import EngineConfig, EngineModel
from emulator.metrics import make_registry
from emulator.pool_service import PoolCollector
from ext_proc.metrics import ExtProcMetrics
from kvgate.config.model import Config
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, PrefixMirror
from kvgate.etcd.observed import MirrorMetrics
from tests.deploy.deploy_support import REPO

DASHBOARD = REPO / "deploy/grafana/kvgate-dashboard.json"
METRIC = re.compile(r"\b(?:kvgate_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
# What the issue asks the dashboard to show, by the metric each needs.
REQUIRED = {
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
    "kvgate_ext_proc_decisions_total", "kvgate_ext_proc_decision_seconds_bucket",
    "vllm:time_to_first_token_seconds_bucket", "kvgate_endpoint_state",
    "kvgate_ext_proc_etcd_errors_total", "kvgate_ext_proc_bindings",
    "kvgate_etcd_mirror_synced", "kvgate_ext_proc_degraded", "kvgate_ext_proc_unbound_total",
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    return {s.name for family in registry.collect() for s in family.samples}


def control_plane_metric_names() -> set[str]:
    """Metric names declared in the control plane's sources (its registry is built at run time
    from live endpoints, so the names are read from the code that declares them)."""
    names = set()
    for path in (REPO / "control_plane").rglob("*.py"):
        names |= set(re.findall(r"[\"'](kvgate_[a-z0-9_]+)[\"']", path.read_text("utf-8")))
    return names


@pytest.fixture(scope="module")
def exported() -> tuple[set[str], set[str]]:
    """(exact sample names from live registries, base names declared in source)."""
    metrics = ExtProcMetrics()
    mirrors = MirrorMetrics("ext_proc", metrics.registry)
    mirrors.track(PrefixMirror(EtcdClient(["127.0.0.1:2379"]), b"/p/", EndpointDirectory(Config()),
                               "endpoints"))  # never started: only its metric names are read
    samples = sample_names(metrics.registry)
    model = EngineModel(EngineConfig(model="m", hbm_tokens=1024))
    samples |= sample_names(make_registry(model, lambda: 0.0))
    pool = CollectorRegistry(auto_describe=False)
    pool.register(PoolCollector(DdrPool(1024, 16)))
    samples |= sample_names(pool)
    return samples, control_plane_metric_names()


def is_exported(name: str, exported: tuple[set[str], set[str]]) -> bool:
    samples, declared = exported
    if name in samples:
        return True
    base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
    return name in declared or base in declared


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return [p for p in found if p["type"] != "row"]


def test_dashboard_loads_with_an_identity_and_a_datasource_variable(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard["uid"] and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_panel_queries_metrics_that_are_exported(
    dashboard: dict[str, Any], exported: tuple[set[str], set[str]]
) -> None:
    for panel in panels(dashboard):
        exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
        assert exprs, f"{panel['title']}: no query"
        named = {m for e in exprs for m in METRIC.findall(e)}
        assert named, f"{panel['title']}: names no kvgate or vLLM metric"
        unknown = {m for m in named if not is_exported(m, exported)}
        assert not unknown, f"{panel['title']}: not exported by kvgate or vLLM: {unknown}"


def test_dashboard_covers_what_the_issue_asks_for(dashboard: dict[str, Any]) -> None:
    named = {m for p in panels(dashboard) for t in p["targets"] for m in METRIC.findall(t["expr"])}
    assert REQUIRED <= named, REQUIRED - named


def test_the_exported_set_is_real(exported: tuple[set[str], set[str]]) -> None:
    samples, _ = exported
    assert {"kvgate_ext_proc_decisions_total", "vllm:prefix_cache_hits_total",
            "vllm:time_to_first_token_seconds_bucket", "kvgate_ddr_pool_blocks"} <= samples
    assert not is_exported("vllm:prefix_cache_hit_total", exported)
