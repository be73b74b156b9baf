"""Off loopback the admin API needs a token; health checks stay open; reflection works."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from control_plane.admin.server import ADMIN_SERVICE, AdminServer
from control_plane.operations import Operations
from kvgate.admin_api.auth import TokenError, is_loopback, load_token
from kvgate.admin_api.v1 import admin_pb2, admin_pb2_grpc
from kvgate.config import HostPort
from kvgate.etcd import EtcdClient
from tests.admin.admin_helpers import Fleet, StartServer, fake_status, run_cli

TOKEN = "s3cret-token"


def test_non_loopback_listener_without_token_refuses() -> None:
    ops = Operations(EtcdClient(["127.0.0.1:1"]), "/kvgate/none/")  # never dialled
    for host in ("0.0.0.0", "10.1.2.3", "::", "admin.example.com"):
        with pytest.raises(TokenError, match="needs a token"):
            AdminServer(ops, fake_status, HostPort(host, 0), None)
        with pytest.raises(TokenError):
            AdminServer(ops, fake_status, HostPort(host, 0), "")
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host)
        AdminServer(ops, fake_status, HostPort(host, 0), None)  # allowed without a token


def test_load_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGATE_ADMIN_TOKEN", raising=False)
    assert load_token() is None
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "  from-env\n")
    assert load_token() == "from-env"
    file = tmp_path / "token"
    file.write_text("from-file\n")
    assert load_token(file=str(file)) == "from-file"  # the file wins over the environment
    file.write_text(" \n")
    assert load_token(file=str(file)) is None
    with pytest.raises(TokenError, match="cannot read admin token file"):
        load_token(file=str(tmp_path / "missing"))


async def _list(channel: grpc.aio.Channel, token: str | None) -> admin_pb2.ListEndpointsResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    stub = admin_pb2_grpc.AdminStub(channel)
    return await stub.ListEndpoints(admin_pb2.ListEndpointsRequest(), metadata=metadata,
                                    timeout=30)


async def _services(channel: grpc.aio.Channel, token: str | None = None) -> list[str]:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata,
        timeout=30)
    async for response in call:
        return [s.name for s in response.list_services_response.service]
    return []


async def _health(channel: grpc.aio.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)).status


async def test_token_required_off_loopback(
    fleet: Fleet, admin_server: StartServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = await admin_server(host="0.0.0.0", token=TOKEN)
    admin = f"127.0.0.1:{server.port}"  # a wildcard listener answers on loopback too
    async with grpc.aio.insecure_channel(admin) as channel:
        for token in (None, "wrong", TOKEN + "x", ""):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _list(channel, token)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len((await _list(channel, TOKEN)).endpoints) == 4
        # Probes carry no credentials: health stays open; reflection does not.
        assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _services(channel)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ADMIN_SERVICE in await _services(channel, TOKEN)

    anonymous = await run_cli("endpoints", "list", admin=admin)
    assert anonymous.code == 1
    assert "refused the call (no token given" in anonymous.err
    wrong = await run_cli("status", admin=admin, env={"KVGATE_ADMIN_TOKEN": "bogus-guess-1"})
    assert wrong.code == 1 and "the token was refused" in wrong.err
    assert "bogus-guess-1" not in wrong.err

    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    # The file wins over a wrong token in the environment.
    ok = await run_cli("endpoints", "list", "--json", "--token-file", str(token_file),
                       admin=admin, env={"KVGATE_ADMIN_TOKEN": "wrong"})
    assert ok.code == 0, ok.err
    assert "10.0.0.11:8000" in ok.out
    by_env = await run_cli("sessions", "list", admin=admin, env={"KVGATE_ADMIN_TOKEN": TOKEN})
    assert by_env.code == 0, by_env.err
    logged = capsys.readouterr()
    assert "admin_api_ready" in logged.out  # the server did log...
    assert TOKEN not in logged.out + logged.err  # ...but never the token


async def test_loopback_token_is_enforced_when_given(
    fleet: Fleet, admin_server: StartServer
) -> None:
    server = await admin_server(token=TOKEN)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _list(channel, None)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len((await _list(channel, TOKEN)).endpoints) == 4


async def test_reflection_and_health(fleet: Fleet, admin_server: StartServer) -> None:
    server = await admin_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        services = await _services(channel)
        assert "kvgate.admin.v1.Admin" in services
        assert "grpc.health.v1.Health" in services
        assert await _health(channel, ADMIN_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="kvgate.admin.v1.Admin")]), timeout=30)
        async for response in call:
            files = response.file_descriptor_response.file_descriptor_proto
            assert files and b"kvgate/admin/v1/admin.proto" in files[0]
            break
    await server.stop(0)
    assert server.port is not None
