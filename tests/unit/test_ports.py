"""Free ports for children and tests."""

from __future__ import annotations

import socket

from kvgate.runtime.ports import free_ports, port_in_use


def test_free_ports_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports[0]))
        held.listen()
        assert port_in_use("127.0.0.1", ports[0])


def test_free_ports_never_hands_out_an_excluded_port() -> None:
    promised = set(free_ports(32))
    again = free_ports(64, exclude=promised)
    assert len(set(again)) == 64
    assert not promised & set(again)
