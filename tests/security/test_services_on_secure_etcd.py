"""ext_proc and the control plane against a real etcd with client-certificate TLS and user
authentication: the gateway works end to end; a wrong password is named, never logged."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml

from kvgate.config.dump import to_dict
from kvgate.config.model import Config, Etcd, EtcdAuth
from kvgate.session import normalize_session
from stack.local import grpc_serving
from tests.support.polling import eventually
from tests.support.ports import free_ports
from tests.support.secure_etcd import PASSWORD, USER, SecureEtcd
from tests.support.stack import gateway_config, running_stack


@pytest.fixture
async def secure_etcd(tmp_path: Path) -> AsyncIterator[SecureEtcd]:
    server = SecureEtcd(tmp_path / "etcd", tls=True, auth=True)
    await server.start()
    yield server
    await server.stop()


def _secured(config: Config, etcd: SecureEtcd, *, password_file: bool = True) -> Config:
    auth = EtcdAuth(USER, str(etcd.password_file) if password_file else None)
    return replace(config, etcd=Etcd((config.etcd.endpoints or ())[:1] or None,
                                     config.etcd.prefix, etcd.tls, auth))


def _write(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(to_dict(config)))
    return path


async def test_the_gateway_works_over_tls_with_a_user(
    tmp_path: Path, upstreams, secure_etcd: SecureEtcd, prefix: str
) -> None:
    ups = await upstreams(3)
    config = _secured(gateway_config([u.address for u in ups], prefix=prefix,
                                     etcd=[secure_etcd.endpoint]), secure_etcd)
    sessions = [f"secure-{i}" for i in range(12)]
    workdir = tmp_path / "stack"
    async with running_stack(config, workdir):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}") as http:
            homes = {}
            for session in sessions:
                reply = await http.get("/v1/chat", headers={"x-session-id": session})
                assert reply.status_code == 200, reply.text
                homes[session] = reply.json()["upstream"]
            for session in sessions:  # sticky: ext_proc reads its bindings back
                reply = await http.get("/v1/chat", headers={"x-session-id": session})
                assert reply.json()["upstream"] == homes[session]
        client = secure_etcd.client()
        try:
            async def stored() -> dict[str, str]:
                kvs, _ = await client.get_prefix(f"{prefix}bindings/".encode())
                return {kv.key.decode().rsplit("/", 1)[1]: json.loads(kv.value)["endpoint"]
                        for kv in kvs}

            async def all_written() -> bool:
                return len(await stored()) == len(sessions)

            await eventually(all_written, 15)
            assert await stored() == {normalize_session(s.encode()): h
                                      for s, h in homes.items()}
            # The control plane wrote membership and endpoint states through the same security.
            records, _ = await client.get_prefix(f"{prefix}endpoints/".encode())
            assert len(records) == 3
        finally:
            await client.close()
        status = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvgate_cli", "status", "--json",
            "--admin", str(config.control_plane.admin), stdout=asyncio.subprocess.PIPE)
        report = json.loads((await asyncio.wait_for(status.communicate(), 30))[0])
        assert [e["state"] for e in report["endpoints"]] == ["active"] * 3
    logs = {p.name: p.read_text() for p in workdir.glob("*.log")}
    assert {"control-plane.log", "ext_proc-0.log"} <= set(logs)
    assert '"etcd_user": "kvgate"' in logs["control-plane.log"]
    assert '"etcd_tls": true' in logs["ext_proc-0.log"]
    for name, text in logs.items():
        assert PASSWORD not in text, name


async def _run(argv: list[str], env: dict[str, str], within: float = 60) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *argv, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), within)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_a_wrong_password_is_named_and_never_logged(
    tmp_path: Path, upstreams, secure_etcd: SecureEtcd, prefix: str
) -> None:
    ups = await upstreams(1)
    config = _secured(gateway_config([u.address for u in ups], prefix=prefix,
                                     etcd=[secure_etcd.endpoint]), secure_etcd,
                      password_file=False)  # the password from KVGATE_ETCD_PASSWORD
    path = _write(config, tmp_path / "kvgate.yaml")
    wrong = {"KVGATE_ETCD_PASSWORD": "Wr0ng-Passw0rd-Given"}
    refused = f"etcd refused the credentials for user '{USER}'"

    code, output = await _run(["control_plane", "-c", str(path), "--log-level", "debug"], wrong)
    assert code == 1, output
    assert refused in output
    assert "Traceback" not in output and "not reachable" not in output
    code, output_ext = await _run(["ext_proc", "-c", str(path), "--log-level", "debug"], wrong)
    assert code == 1, output_ext
    assert refused in output_ext and "Traceback" not in output_ext
    for text in (output, output_ext):
        assert "Wr0ng-Passw0rd-Given" not in text and PASSWORD not in text

    code, output = await _run(["ext_proc", "-c", str(path)], {"KVGATE_ETCD_PASSWORD": ""})
    assert code == 2
    assert "no password for etcd user 'kvgate'" in output and "KVGATE_ETCD_PASSWORD" in output


async def test_debug_logs_of_a_working_ext_proc_never_hold_the_password(
    tmp_path: Path, upstreams, secure_etcd: SecureEtcd, prefix: str
) -> None:
    ups = await upstreams(1)
    listen, metrics = free_ports(2)
    config = _secured(gateway_config([u.address for u in ups], prefix=prefix,
                                     etcd=[secure_etcd.endpoint]), secure_etcd,
                      password_file=False)
    path = _write(config, tmp_path / "kvgate.yaml")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ext_proc", "-c", str(path), "--log-level", "debug",
        "--listen", f"127.0.0.1:{listen}", "--metrics", f"127.0.0.1:{metrics}",
        env={**os.environ, "KVGATE_ETCD_PASSWORD": PASSWORD},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        from kvgate.config.model import HostPort

        async def serving() -> bool:
            try:
                return await grpc_serving(HostPort("127.0.0.1", listen))
            except Exception:
                return False

        await eventually(serving, 30)
        async with httpx.AsyncClient() as http:
            async def synced() -> bool:
                text = (await http.get(f"http://127.0.0.1:{metrics}/metrics")).text
                return ('kvgate_etcd_mirror_synced{mirror="bindings",service="ext_proc"} 1.0'
                        in text)

            await eventually(synced, 15)
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode()
    assert process.returncode == 0, text
    assert '"etcd_user": "kvgate"' in text and "etcd_mirror_synced" in text
    assert PASSWORD not in text


async def test_etcd_security_cannot_change_by_reload(
    tmp_path: Path, upstreams, secure_etcd: SecureEtcd, prefix: str
) -> None:
    from tests.failsafe.failsafe_helpers import running_control_plane

    ups = await upstreams(1)
    config = _secured(gateway_config([u.address for u in ups], prefix=prefix,
                                     etcd=[secure_etcd.endpoint]), secure_etcd)
    path = _write(config, tmp_path / "kvgate.yaml")
    async with running_control_plane(config, path) as service:
        other = tmp_path / "other-password"
        other.write_text("another\n")
        _write(replace(config, etcd=replace(config.etcd, auth=EtcdAuth(USER, str(other)))), path)
        assert not await service.reload()
        assert service.last_reload_error == (
            "etcd.auth cannot change while running; restart instead")
        _write(config, path)
        assert await service.reload()  # the same security: applies
