"""Off loopback the admin API needs a token; health checks stay open; reflection works."""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from control_plane.admin.server import ADMIN_SERVICE, AdminServer
from control_plane.operations import Operations
from kvgate.admin_api.auth import READ_METHODS, TokenError, is_loopback, load_token
from kvgate.admin_api.token_file import read_token, token_path, write_token
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
        assert len((await _list(channel, TOKEN)).endpoints) == 5
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


async def _drain(channel: grpc.aio.Channel, token: str | None) -> admin_pb2.Endpoint:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    stub = admin_pb2_grpc.AdminStub(channel)
    reply = await stub.DrainEndpoint(admin_pb2.DrainEndpointRequest(address="10.0.0.12:8000"),
                                     metadata=metadata, timeout=5)
    return reply.endpoint


async def test_on_loopback_anyone_reads_but_only_the_operator_token_acts(
    fleet: Fleet, admin_server: StartServer, private_runtime_dir: Path,
) -> None:
    server = await admin_server()  # no token configured: the server makes the operator's
    path = private_runtime_dir / "kvgate" / f"operator-token-{server.port}"
    assert server.token_file == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text().strip()
    assert len(token) >= 40
    admin = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(admin) as channel:
        assert len((await _list(channel, None)).endpoints) == 5  # reading needs nothing
        stub = admin_pb2_grpc.AdminStub(channel)
        for call, request in (
            (stub.DrainEndpoint, admin_pb2.DrainEndpointRequest(address="10.0.0.12:8000")),
            (stub.UndrainEndpoint, admin_pb2.UndrainEndpointRequest(address="10.0.0.12:8000")),
            (stub.FailEndpoint, admin_pb2.FailEndpointRequest(address="10.0.0.12:8000")),
            (stub.MoveSession, admin_pb2.MoveSessionRequest(session="s",
                                                            endpoint="10.0.0.12:8000")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "needs the operator token" in (refused.value.details() or "")
            assert str(path) in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _list(channel, "a-wrong-guess")  # a wrong token is refused, even to read
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert (await _drain(channel, token)).state == "draining"

    # The CLI of the same user finds the token by itself...
    undrained = await run_cli("endpoints", "undrain", "10.0.0.12:8000", admin=admin)
    assert undrained.code == 0, undrained.err
    # ...a process without it (another user's: another runtime folder) reads, but cannot act.
    elsewhere = {"XDG_RUNTIME_DIR": str(private_runtime_dir / "kvgate")}
    status = await run_cli("status", admin=admin, env=elsewhere)
    assert status.code == 0, status.err
    refused_cli = await run_cli("endpoints", "drain", "10.0.0.12:8000", admin=admin, env=elsewhere)
    assert refused_cli.code == 1
    assert "needs the operator token" in refused_cli.err and token not in refused_cli.err
    await server.stop(0)
    assert not path.exists()  # removed with the server


async def test_on_loopback_a_configured_token_is_the_operator_token(
    fleet: Fleet, admin_server: StartServer, private_runtime_dir: Path,
) -> None:
    server = await admin_server(token=TOKEN)
    assert server.token_file is None and not (private_runtime_dir / "kvgate").exists()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert len((await _list(channel, None)).endpoints) == 5
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _drain(channel, None)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "KVGATE_ADMIN_TOKEN" in (refused.value.details() or "")
        assert (await _drain(channel, TOKEN)).state == "draining"


READ_TOKEN = "read-only-token-0123"


async def test_read_only_and_operator_tokens_are_distinct_off_loopback(
    fleet: Fleet, admin_server: StartServer,
) -> None:
    with pytest.raises(TokenError, match="must differ"):
        await admin_server(host="0.0.0.0", token=TOKEN, read_token=TOKEN)
    server = await admin_server(host="0.0.0.0", token=TOKEN, read_token=READ_TOKEN)
    admin = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(admin) as channel:
        for anonymous in (_list(channel, None), _drain(channel, None)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await anonymous
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len((await _list(channel, READ_TOKEN)).endpoints) == 5
        assert ADMIN_SERVICE in await _services(channel, READ_TOKEN)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _drain(channel, READ_TOKEN)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "read-only" in (refused.value.details() or "")
        assert len((await _list(channel, TOKEN)).endpoints) == 5
        assert (await _drain(channel, TOKEN)).state == "draining"
    reader = {"KVGATE_ADMIN_TOKEN": READ_TOKEN}
    assert (await run_cli("endpoints", "list", admin=admin, env=reader)).code == 0
    denied = await run_cli("endpoints", "fail", "10.0.0.12:8000", admin=admin, env=reader)
    assert denied.code == 1 and "needs the operator token; this one is read-only" in denied.err


def test_every_admin_method_has_a_role() -> None:
    service = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
    methods = {f"/{service.full_name}/{m.name}" for m in service.methods}
    assert READ_METHODS <= methods
    assert {m.rsplit("/", 1)[1] for m in methods - READ_METHODS} == {
        "DrainEndpoint", "UndrainEndpoint", "FailEndpoint", "MoveSession"}


def test_the_token_folder_must_be_private(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(TokenError, match="may be written by other users"):
        write_token(shared / "operator-token-1", "t")
    mine = tmp_path / "mine" / "operator-token-2"
    write_token(mine, "t0ken")
    assert read_token(mine) == "t0ken"
    mine.chmod(0o644)  # readable by others: not trusted
    assert read_token(mine) is None
    assert token_path(18001, {"XDG_RUNTIME_DIR": str(tmp_path)}) == (
        tmp_path / "kvgate" / "operator-token-18001")
    assert token_path(18001, {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == (
        tmp_path / "cfg" / "kvgate" / "operator-token-18001")


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
