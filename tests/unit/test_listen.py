"""A service that cannot listen says where, why and what to change (kvgate.runtime.tasks.listen):
a real gRPC server and the ext_proc service (gRPC and HTTP) on a loopback port this test holds,
and an address that is not this machine's."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from ext_proc.service import ExtProcOptions, ExtProcService
from kvgate.config.load import load_text
from kvgate.config.model import HostPort
from kvgate.runtime.tasks.listen import ListenError, listen_grpc, listen_metrics


@pytest.fixture
def held() -> Iterator[HostPort]:
    """A loopback port another socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield HostPort("127.0.0.1", sock.getsockname()[1])


def in_use(address: HostPort, listener: str) -> str:
    """What the error says of a port this process listens on."""
    return (f"cannot listen on {address} ({listener}): the port is in use (listening, by pid "
            f"{os.getpid()} (")


async def test_a_grpc_server_on_a_held_port_names_it_its_holder_and_the_setting(
        held: HostPort) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    try:
        with pytest.raises(ListenError) as refused:
            listen_grpc(server, held, "xDS", "--xds or control_plane.xds")
    finally:
        await server.stop(None)
    said = str(refused.value)
    assert said.startswith(in_use(held, "xDS")), said
    assert said.endswith("; stop what holds it, or set --xds or control_plane.xds to another "
                         "port"), said


async def test_an_address_not_of_this_machine_is_named_as_such() -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    elsewhere = HostPort("192.0.2.1", 9002)  # TEST-NET-1 (RFC 5737): on no host
    try:
        with pytest.raises(ListenError) as refused:
            listen_grpc(server, elsewhere, "gRPC", "--listen or ext_proc.address")
    finally:
        await server.stop(None)
    assert str(refused.value) == (
        "cannot listen on 192.0.2.1:9002 (gRPC): the host is not an address of this machine; "
        "set --listen or ext_proc.address to one of its addresses (127.0.0.1 for this machine "
        "only)")


async def test_a_free_port_binds_and_port_0_takes_one() -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    try:
        port = listen_grpc(server, HostPort("127.0.0.1", 0), "xDS", "--xds")
        assert port > 0
    finally:
        await server.stop(None)


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_ext_proc_on_a_held_port_refuses_to_start_saying_so(
        transport: str, held: HostPort) -> None:
    config = load_text("pools: [{name: p, endpoints: [10.0.0.1:8000]}]\n"
                       f"ext_proc: {{transport: {transport}}}\n")
    service = ExtProcService(config, ExtProcOptions(listen=held, metrics=None))
    try:
        with pytest.raises(ListenError) as refused:
            await service.start()
    finally:
        await service.stop(grace=0)
    listener = {"grpc": "gRPC", "http": "HTTP"}[transport]
    said = str(refused.value)
    assert said.startswith(in_use(held, listener)), said
    assert said.endswith("set --listen or ext_proc.address to another port"), said


async def test_ext_proc_metrics_on_a_held_port_refuses_to_start_saying_so(held: HostPort) -> None:
    config = load_text("pools: [{name: p, endpoints: [10.0.0.1:8000]}]\n")
    service = ExtProcService(config, ExtProcOptions(listen=HostPort("127.0.0.1", 0),
                                                    metrics=held))
    try:
        with pytest.raises(ListenError) as refused:
            await service.start()
    finally:
        await service.stop(grace=0)
    said = str(refused.value)
    assert said.startswith(in_use(held, "metrics")), said
    assert said.endswith("set --metrics or ext_proc.metrics to another port"), said


async def test_a_metrics_port_held_says_so_in_one_line_and_port_0_takes_one(
    held: HostPort,
) -> None:
    """Both services' /metrics ports bind through listen_metrics (ext_proc's, above; the
    control plane's names --metrics): aiohttp's own words are replaced, not wrapped."""
    with pytest.raises(ListenError) as refused:
        await listen_metrics(CollectorRegistry(), held, "--metrics")
    said = str(refused.value)
    assert said.startswith(in_use(held, "metrics")), said
    assert said.endswith("set --metrics to another port"), said
    assert "\n" not in said and "attempting to bind" not in said, said
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    served = await listen_metrics(CollectorRegistry(), HostPort("127.0.0.1", 0), "--metrics")
    try:
        assert served.port > 0
    finally:
        await served.stop()
