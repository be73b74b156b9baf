"""Who holds a port (/proc): a listener named by pid and command line; a port held only by a
closed connection in TIME-WAIT told apart, and waited for rather than refused."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvgate.config.model import HostPort
from kvgate.runtime.children.port_owner import _command, holder, only_time_wait, sockets_on
from kvgate.runtime.children.ports import port_in_use, wait_for_ports
from tests.support.polling import eventually_sync


@contextmanager
def _closed_connection(closes_first: str) -> Iterator[int]:
    """A connection over loopback, closed by `closes_first` ("client" or "server"), whose
    TIME-WAIT side's local port is yielded."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        first, second = (client, accepted) if closes_first == "client" else (accepted, client)
        port = first.getsockname()[1]
        first.close()
        eventually_sync(lambda: second.recv(1) == b"", 5)  # the FIN arrived
        second.close()
        if closes_first == "server":
            server.close()
        eventually_sync(lambda: any(s.state == "TIME_WAIT"
                                    for s in sockets_on("127.0.0.1", port)), 5)
        yield port


def test_a_listener_is_named_by_pid_and_command() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        said = holder("127.0.0.1", port)
        assert said is not None and said.startswith("listening, by ")
        assert f"pid {os.getpid()} (" in said
        assert not only_time_wait("127.0.0.1", port)
    assert holder("127.0.0.1", port) is None


def test_a_command_line_with_line_breaks_is_told_on_one_line(tmp_path: Path) -> None:
    (tmp_path / "cmdline").write_bytes(b"python3\0-c\0import os\nwhile True:\n    pass\0")
    assert _command(tmp_path) == "python3 -c import os while True: pass"


def test_a_servers_own_time_wait_never_blocks_it() -> None:
    with _closed_connection("server") as port:
        assert only_time_wait("127.0.0.1", port)
        assert not port_in_use("127.0.0.1", port)  # checked with SO_REUSEADDR, as servers bind


async def test_a_port_held_only_in_time_wait_is_waited_for_and_then_told() -> None:
    with _closed_connection("client") as port:
        assert only_time_wait("127.0.0.1", port)
        said = holder("127.0.0.1", port)
        assert said is not None and "TIME-WAIT" in said and "within 60 s" in said
        if not port_in_use("127.0.0.1", port):
            return  # this kernel lets servers take it anyway: nothing to wait for
        reported: list[str] = []
        busy = await wait_for_ports([("gateway listener", HostPort("127.0.0.1", port))],
                                    time_wait_s=0.3, report=reported.append, every=0.05)
        assert len(reported) == 1 and "waiting up to 0.3 s" in reported[0]
        assert [(name, why) for name, _, why in busy] == [("gateway listener", said)]
