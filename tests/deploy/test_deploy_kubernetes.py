"""deploy/kubernetes/: schema-valid offline (kubernetes-validate's bundled schemas), least
privilege, probes and scrape annotations on every pod, and kvgate/Envoy commands that kvgate's
argparse and Envoy's own validator accept, consistent with the mounted ConfigMaps."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvgate.config.model import Config
from tests.deploy.deploy_support import (
    CLIENT_FILES,
    ETCD_FILES,
    REPO,
    assert_etcd_compacts,
    envoy_validate,
    host_port,
    load_mounted_config,
    load_yaml,
    load_yaml_docs,
    make_certs,
    option,
    parse_kvgate,
    xds_cluster,
)

K8S = REPO / "deploy/kubernetes"
# Oldest and newest Kubernetes minor versions the manifests are checked against (grpc probes are
# GA since 1.27).
VERSIONS = ("1.29.0", "1.37.0")
CLUSTER_SCOPED = {
    "ClusterRole", "ClusterRoleBinding", "Namespace", "PersistentVolume", "StorageClass",
    "CustomResourceDefinition", "PriorityClass", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "Node", "ClusterIssuer",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}
KVGATE_TLS = "/var/run/secrets/kvgate-etcd"  # the kvgate-etcd-client-tls Secret, in kvgate's pods
# The names deploy/README.md gives deploy/tls/make-etcd-certs.sh for this example.
ETCD_NAMES = ("etcd-client", "etcd-client.kvgate", "etcd-client.kvgate.svc", "*.etcd",
              "*.etcd.kvgate", "*.etcd.kvgate.svc", "*.etcd.kvgate.svc.cluster.local",
              "localhost", "127.0.0.1")


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    found = [doc for path in manifest_files() for doc in load_yaml_docs(path)]
    assert found
    return found


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], d["spec"]["template"]) for d in docs if d["kind"] in WORKLOADS]


def containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(f"{name}/{c['name']}", c, tpl["spec"])
            for name, tpl in pod_specs(docs) for c in tpl["spec"]["containers"]]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("k8s") / "tls", *ETCD_NAMES)


@pytest.fixture(scope="module")
def config(docs: list[dict[str, Any]], certs: Path) -> Config:
    # the TLS files checked for real, as the pods see them
    return load_mounted_config(find(docs, "ConfigMap", "kvgate-config")["data"]["kvgate.yaml"],
                               "configmap-kvgate.yaml", {KVGATE_TLS: certs})


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(
    docs: list[dict[str, Any]], version: str
) -> None:
    problems = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(map(str, exc.path))
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {where}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_the_validator_is_not_vacuous(docs: list[dict[str, Any]]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(find(docs, "Deployment", "kvgate-gateway")))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grcp"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest_but_the_secret_template() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    assert all((K8S / r).is_file() for r in resources)
    expected = {p.name for p in manifest_files() if not p.name.endswith(".example.yaml")}
    assert set(resources) == expected


def test_namespace_scoped_and_no_rbac(docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in docs}
    assert not kinds & CLUSTER_SCOPED
    assert not kinds & {"Role", "RoleBinding"}  # kvgate never calls the Kubernetes API
    for doc in docs:
        assert "namespace" not in doc["metadata"], doc["metadata"]["name"]
    for doc in docs:
        if doc["kind"] == "ServiceAccount":
            assert doc["automountServiceAccountToken"] is False


def test_pods_run_with_least_privilege(docs: list[dict[str, Any]]) -> None:
    for name, template in pod_specs(docs):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["serviceAccountName"], name
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), name
        assert not any("hostPath" in v for v in spec.get("volumes", [])), name
    for name, container, _ in containers(docs):
        ctx = container["securityContext"]
        assert ctx.get("privileged", False) is False, name
        assert ctx["allowPrivilegeEscalation"] is False, name
        assert ctx["readOnlyRootFilesystem"] is True, name
        assert ctx["capabilities"]["drop"] == ["ALL"], name
        assert not ctx["capabilities"].get("add"), name
        assert ctx.get("runAsUser", 1) != 0, name
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), name


def _port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        assert port in {p["containerPort"] for p in container["ports"]}
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def test_every_container_has_probes_on_its_own_ports(docs: list[dict[str, Any]]) -> None:
    for name, container, _ in containers(docs):
        for kind in ("readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            assert probe, f"{name}: no {kind}"
            (handler,) = [k for k in ("grpc", "httpGet", "tcpSocket", "exec") if k in probe]
            if handler != "exec":
                _port_number(container, probe[handler]["port"])


def test_every_pod_has_prometheus_scrape_annotations(docs: list[dict[str, Any]]) -> None:
    for name, template in pod_specs(docs):
        notes = template["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true", name
        assert notes["prometheus.io/path"].startswith("/"), name
        ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert int(notes["prometheus.io/port"]) in ports, name


def test_kvgate_commands_parse_and_match_the_config(docs: list[dict[str, Any]],
                                                    config: Config) -> None:
    kvgate = [(n, c, s) for n, c, s in containers(docs) if c["command"][0] == "kvgate"]
    assert {c["command"][1] for _, c, _ in kvgate} == {"control-plane", "ext-proc"}
    etcd_endpoints = ",".join(str(e) for e in config.etcd.endpoints or ())
    for name, container, spec in kvgate:
        command = container["command"]
        args = parse_kvgate(command, f"deploy/kubernetes: {name}")
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        config_dir, _, key = args.config.rpartition("/")
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[config_dir])
        assert volume["configMap"]["name"] == "kvgate-config" and key == "kvgate.yaml", name
        assert option(command, "--etcd") == etcd_endpoints, name
        ports = {p["containerPort"] for p in container["ports"]}
        if command[1] == "ext-proc":
            listen = host_port(option(command, "--listen"))
            metrics = host_port(option(command, "--metrics"))
            assert listen[1] == config.ext_proc.addresses[0].port, name
            assert config.ext_proc.addresses[0].host == "127.0.0.1"  # sidecar: never leaves pod
            assert metrics == (config.ext_proc.metrics.host, config.ext_proc.metrics.port)
            assert container["readinessProbe"]["grpc"]["port"] == listen[1]
            assert {listen[1], metrics[1]} <= ports
        else:
            admin = host_port(option(command, "--admin"))
            assert admin == (config.control_plane.admin.host, config.control_plane.admin.port)
            assert container["readinessProbe"]["grpc"]["port"] == admin[1]
            metrics = host_port(option(command, "--metrics"))
            assert container["livenessProbe"]["httpGet"]["port"] == metrics[1]
            assert {config.control_plane.xds.port, admin[1], metrics[1]} <= ports


def test_admin_token_comes_from_the_secret(docs: list[dict[str, Any]]) -> None:
    deployment = find(docs, "Deployment", "kvgate-control-plane")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    token_file = option(container["command"], "--admin-token-file")
    directory, _, file = token_file.rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])["secret"]
    template = next(d for d in load_yaml_docs(K8S / "admin-token-secret.example.yaml"))
    assert volume["secretName"] == template["metadata"]["name"]
    assert [i["path"] for i in volume["items"]] == [file]
    assert [i["key"] for i in volume["items"]] == list(template["stringData"])


def test_control_plane_is_replicated_behind_its_service(docs: list[dict[str, Any]],
                                                        config: Config) -> None:
    deployment = find(docs, "Deployment", "kvgate-control-plane")
    assert deployment["spec"]["replicas"] == 2
    service = find(docs, "Service", "kvgate-control-plane")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports["xds"] == config.control_plane.xds.port
    assert ports["admin"] == config.control_plane.admin.port


def test_gateway_pod_runs_envoy_with_its_ext_proc_sidecar(
    docs: list[dict[str, Any]], config: Config, tmp_path: Path
) -> None:
    deployment = find(docs, "Deployment", "kvgate-gateway")
    spec = deployment["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in spec["containers"]}
    assert set(by_name) == {"envoy", "ext-proc"}
    envoy = by_name["envoy"]
    assert envoy["image"].startswith("envoyproxy/envoy:v1.40")
    command = envoy["command"]
    assert option(command, "--service-cluster") == "kvgate"
    assert option(command, "--service-node") == "$(POD_NAME)"  # unique per pod
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        envoy["env"])
    # the bootstrap comes from the ConfigMap and points ADS at the control plane's Service
    directory, _, key = option(command, "-c").rpartition("/")
    (mount,) = [m for m in envoy["volumeMounts"] if m["mountPath"] == directory]
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    configmap = find(docs, "ConfigMap", volume["configMap"]["name"])
    text = configmap["data"][key]
    bootstrap = yaml.safe_load(text)
    xds_host, xds_port = xds_cluster(bootstrap)
    service = find(docs, "Service", xds_host)
    assert xds_port in {p["port"] for p in service["spec"]["ports"] if p["name"] == "xds"}
    admin = bootstrap["admin"]["address"]["socket_address"]["port_value"]
    assert admin == config.envoy_admin.port
    assert envoy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": admin}
    assert config.listener.port in {p["containerPort"] for p in envoy["ports"]}
    gateway = find(docs, "Service", "kvgate-gateway")
    assert gateway["spec"]["ports"][0]["targetPort"] == "http"
    path = tmp_path / key
    path.write_text(text, encoding="utf-8")
    envoy_validate([a.replace("$(POD_NAME)", "gw-0") for a in command], path, "gateway envoy")


def test_etcd_example_is_a_three_member_statefulset(docs: list[dict[str, Any]],
                                                    config: Config) -> None:
    sts = find(docs, "StatefulSet", "etcd")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = find(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    cluster = option(container["command"], "--initial-cluster").split(",")
    service = sts["spec"]["serviceName"]
    assert cluster == [f"etcd-{i}=https://etcd-{i}.{service}:2380" for i in range(3)]
    assert_etcd_compacts(container["command"])
    for endpoint in config.etcd.endpoints or ():
        client = find(docs, "Service", endpoint.host)
        assert endpoint.port in {p["port"] for p in client["spec"]["ports"]}
        assert client["spec"]["selector"].items() <= (
            sts["spec"]["template"]["metadata"]["labels"].items())


def _secret_mount(container: dict[str, Any], spec: dict[str, Any], path: str) -> str:
    """The name of the Secret mounted at `path` in `container`."""
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return str(volume["secret"]["secretName"])


def test_etcd_speaks_tls_to_clients_and_peers(docs: list[dict[str, Any]], config: Config,
                                              certs: Path) -> None:
    sts = find(docs, "StatefulSet", "etcd")
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = container["command"]
    assert _secret_mount(container, spec, "/etc/etcd/tls") == "kvgate-etcd-server-tls"
    for prefix in ("", "peer-"):
        assert f"--{prefix}client-cert-auth" in command
        for flag, name in (("cert-file", "etcd.pem"), ("key-file", "etcd-key.pem"),
                           ("trusted-ca-file", "ca.pem")):
            assert option(command, f"--{prefix}{flag}") == f"/etc/etcd/tls/{name}"
            assert name in ETCD_FILES
    for flag in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
                 "--initial-advertise-peer-urls"):
        assert option(command, flag).startswith("https://"), flag
    # the certificate the docs make names what kvgate dials and what the members call each other
    san = subprocess.run(["openssl", "x509", "-in", str(certs / "etcd.pem"), "-noout", "-ext",
                          "subjectAltName"], capture_output=True, text=True, check=True).stdout
    for endpoint in config.etcd.endpoints or ():
        assert f"DNS:{endpoint.host}" in san
    assert "DNS:*.etcd" in san  # etcd-0.etcd, ... (--initial-advertise-peer-urls)
    readme = (REPO / "deploy/README.md").read_text()
    assert "make-etcd-certs.sh etcd-tls " + " ".join(
        f"'{n}'" if "*" in n else n for n in ETCD_NAMES) in readme
    for secret, files in (("kvgate-etcd-server-tls", ETCD_FILES),
                          ("kvgate-etcd-client-tls", CLIENT_FILES)):
        assert f"create secret generic {secret} " + " ".join(
            f"--from-file=etcd-tls/{f}" for f in files) in readme


def test_kvgate_reaches_etcd_with_its_client_certificate(docs: list[dict[str, Any]],
                                                         config: Config) -> None:
    tls = config.etcd.tls
    assert tls is not None and tls.ca and tls.cert and tls.key
    assert sorted(Path(p).name for p in (tls.ca, tls.cert, tls.key)) == sorted(CLIENT_FILES)
    kvgate = [(n, c, s) for n, c, s in containers(docs) if c["command"][0] == "kvgate"]
    assert len(kvgate) == 2
    for name, container, spec in kvgate:
        assert _secret_mount(container, spec, KVGATE_TLS) == "kvgate-etcd-client-tls", name


def _admits(policy: dict[str, Any], labels: dict[str, str], port: int) -> list[dict[str, Any]]:
    """The `from` lists of `policy`'s ingress rules that let traffic reach `port` on a pod with
    `labels` ([{}] stands for "from anywhere")."""
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    if any(labels.get(k) != v for k, v in wanted.items()):
        return []
    return [rule.get("from", [{}]) for rule in policy["spec"].get("ingress", [])
            if any(p["port"] == port for p in rule.get("ports", []))]


def test_network_policies_deny_by_default_and_open_only_what_is_used(
    docs: list[dict[str, Any]],
) -> None:
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    local_only = {9002}  # ext_proc: Envoy in the same pod calls it over loopback
    for name, template in pod_specs(docs):
        labels = template["metadata"]["labels"]
        for c in template["spec"]["containers"]:
            for port in (p["containerPort"] for p in c.get("ports", [])):
                sources = [s for p in policies for s in _admits(p, labels, port)]
                if port in local_only:
                    assert sources == [], (name, port)
                else:
                    assert sources, f"{name}/{c['name']}: nothing may reach port {port}"
    control_plane = find(docs, "Deployment", "kvgate-control-plane")["spec"]["template"]
    # The admin API and xDS are never open to the world (an empty `from` entry).
    for port in (18000, 18001):
        for sources in (_admits(p, control_plane["metadata"]["labels"], port) for p in policies):
            assert all(entry for group in sources for entry in group), port
