"""Validate, then act: a control plane that refuses to start has written nothing to etcd; a
reload that fails (a crash in parsing, etcd refusing) changes nothing and the next good file
applies. The real `python -m control_plane` where it matters, a real etcd throughout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from control_plane.admin.server import AdminServer
from control_plane.operations import Operations
from control_plane.status import ControlPlaneStatus
from kvgate.config.model import HostPort
from kvgate.endpoints.records import EndpointRecord, record_key
from kvgate.etcd import EtcdClient
from kvgate.etcd.client import Guard, Write
from kvgate.runtime.children.child import Child
from stack.local import grpc_serving
from tests.admin.admin_helpers import run_cli
from tests.failsafe.failsafe_helpers import (
    control_plane_config,
    running_control_plane,
    with_endpoints,
    write_config,
)
from tests.support.polling import eventually
from tests.support.ports import free_ports

DEEP = "pools: " + "[" * 20_000 + "]" * 20_000 + "\n"  # RecursionError in the YAML composer


async def test_sighup_after_a_recursion_error_still_applies_a_later_valid_file(
    etcd, prefix: str, tmp_path: Path, upstreams
) -> None:
    a, b, c = await upstreams(3)
    config = control_plane_config([a.address, b.address], etcd.endpoint, prefix)
    path = write_config(tmp_path / "kvgate.yaml", config)
    child = Child("control-plane", [sys.executable, "-m", "control_plane", "-c", str(path)],
                  tmp_path / "control-plane.log")
    await child.start()
    client = EtcdClient([etcd.endpoint])
    try:
        admin = config.control_plane.admin
        await child.wait_ready(lambda: grpc_serving(admin), 30)
        assert child.process is not None
        path.write_text(DEEP)
        child.process.send_signal(signal.SIGHUP)

        async def bad_file_reported() -> bool:
            status = await _status(admin)
            crashed = any(t["task"] == "reload" for t in status.get("failing_tasks", []))
            return crashed or bool(status["last_reload_error"])

        await eventually(bad_file_reported, within=15)
        write_config(path, with_endpoints(config, [a.address, b.address, c.address]))
        child.process.send_signal(signal.SIGHUP)

        async def applied() -> bool:
            return await client.get(record_key(prefix, "coder", c.address)) is not None

        await eventually(applied, within=15)
        status = await _status(admin)
        assert status["last_reload_error"] is None
        assert status["membership_generation"] == 2
    finally:
        await client.close()
        await child.stop()


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other process is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("case", ["admin-off-loopback-without-token", "admin-port-in-use",
                                  "xds-port-in-use"])
async def test_a_control_plane_that_refuses_to_start_has_written_nothing(
    case: str, etcd, prefix: str, tmp_path: Path, held_port: int
) -> None:
    config = control_plane_config(["127.0.0.1:9"], etcd.endpoint, prefix)
    path = write_config(tmp_path / "kvgate.yaml", config)
    flags = {
        "admin-off-loopback-without-token": ["--admin", f"0.0.0.0:{free_ports(1)[0]}"],
        "admin-port-in-use": ["--admin", f"127.0.0.1:{held_port}"],
        "xds-port-in-use": ["--xds", f"127.0.0.1:{held_port}"],
    }[case]
    env = {k: v for k, v in os.environ.items() if k != "KVGATE_ADMIN_TOKEN"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "control_plane", "-c", str(path), *flags, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode != 0
    client = EtcdClient([etcd.endpoint])
    try:
        written, _ = await client.get_prefix(prefix.encode())
    finally:
        await client.close()
    assert [kv.key for kv in written] == []
    assert ("token" if "token" in case else "cannot listen") in err.decode()


async def test_a_reload_etcd_refuses_changes_nothing_and_applies_once_etcd_answers(
    etcd, prefix: str, tmp_path: Path, upstreams
) -> None:
    a, b, c = await upstreams(3)
    config = control_plane_config([a.address, b.address], etcd.endpoint, prefix)
    path = write_config(tmp_path / "kvgate.yaml", config)
    # Reloads only when asked (and on its own retries), so this test's reload is the only one.
    async with running_control_plane(config, path, watch_file=False) as service:
        assert service.cache.current is not None
        served = service.cache.current.version
        await etcd.stop()
        write_config(path, with_endpoints(config, [a.address, b.address, c.address]))
        assert not await service.reload()
        error = service.last_reload_error
        assert error is not None and "unavailable" in error and "running config stays" in error
        assert service.config == config  # nothing applied in memory
        assert c.address not in service.directory.states()["coder"]
        assert service.cache.current.version == served  # nor sent to Envoy
        # The order a reader may rely on: the failed reload's error is gone before the new
        # endpoint shows. The endpoints mirror may apply etcd's event before the write's reply
        # reaches the reload (a busy machine does it): the reply is made late here, and the
        # error is read at the moment the record lands.
        errors_when_seen: list[str | None] = []
        set_record, commit = service.directory.set_record, service._etcd.commit

        def spying(record: EndpointRecord) -> None:
            if record.address == c.address:
                errors_when_seen.append(service.last_reload_error)
            set_record(record)

        async def late_reply(guards: Sequence[Guard], writes: Sequence[Write]) -> int | None:
            revision = await commit(guards, writes)
            await asyncio.sleep(0.5)
            return revision

        service.directory.set_record = spying  # type: ignore[method-assign]
        service._etcd.commit = late_reply  # type: ignore[method-assign]
        await etcd.start()
        # The reload task retries etcd's refusals by itself, with backoff.
        await eventually(lambda: c.address in service.directory.states()["coder"], within=30)
        assert errors_when_seen and set(errors_when_seen) == {None}, errors_when_seen
        assert service.last_reload_error is None
        client = EtcdClient([etcd.endpoint])
        try:
            assert await client.get(record_key(prefix, "coder", c.address)) is not None
        finally:
            await client.close()


async def _status(admin: HostPort) -> dict:
    result = await run_cli("status", "--json", admin=str(admin))
    assert result.code == 0, result.err
    return json.loads(result.out)


async def test_the_admin_api_says_not_serving_until_the_control_plane_is_ready(
    etcd, prefix: str
) -> None:
    client = EtcdClient([etcd.endpoint])
    server = AdminServer(Operations(client, prefix), lambda: ControlPlaneStatus("x", None, "", ""),
                         HostPort("127.0.0.1", 0), None)
    try:
        await server.start(serving=False)
        assert not await grpc_serving(server.address)  # bound, but `kvgate up` must wait
        await server.set_serving()
        assert await grpc_serving(server.address)
    finally:
        await server.stop(0)
        await client.close()
