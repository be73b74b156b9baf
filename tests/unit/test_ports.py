"""Free ports for children and tests."""

from __future__ import annotations

import socket

import pytest

from kvgate.runtime.children.ports import (
    NoFreePorts,
    ReservedPorts,
    free_ports,
    parse_port_range,
    port_in_use,
)


def test_free_ports_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports[0]))
        held.listen()
        assert port_in_use("127.0.0.1", ports[0])


def test_port_ranges_parse_or_say_what_is_wrong() -> None:
    assert parse_port_range("30000-30999") == (30000, 30999)
    assert parse_port_range(" 8080-8080 ") == (8080, 8080)
    for bad, message in (("30000", "expected LOW-HIGH"), ("a-b", "expected LOW-HIGH"),
                         ("9-8", "1 <= LOW <= HIGH <= 65535"), ("0-10", "1 <= LOW"),
                         ("1-65536", "<= 65535")):
        with pytest.raises(ValueError, match=message):
            parse_port_range(bad)


def test_free_ports_within_a_range_skip_taken_ones_and_say_when_too_few() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        low = min(taken, 65535 - 39)
        within = (low, low + 39)
        ports = free_ports(20, within=within)
        assert len(set(ports)) == 20
        assert all(low <= p <= low + 39 for p in ports) and taken not in ports
        assert not any(port_in_use("127.0.0.1", p) for p in ports)  # all released again
        with pytest.raises(NoFreePorts, match=f"of the 1 ports needed are free in {taken}-"):
            free_ports(1, within=(taken, taken))


def test_reserved_ports_are_kept_from_others_but_a_child_reusing_addresses_gets_them() -> None:
    with ReservedPorts(3) as reserved:
        port = reserved.ports[0]
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # anything else: refused
        with pytest.raises(NoFreePorts):  # nor does another reservation take one
            ReservedPorts(1, within=(port, port))
        for _ in range(2):  # a child, started twice over
            with socket.socket() as child:
                child.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                child.bind(("127.0.0.1", port))
                child.listen()
                client = socket.create_connection(("127.0.0.1", port))
                accepted, _ = child.accept()
                client.close()  # the client closes first: the port is left without TIME_WAIT
                assert accepted.recv(1) == b""
                accepted.close()
    with socket.socket() as after:  # released at the end
        after.bind(("127.0.0.1", port))


def test_free_ports_never_hands_out_an_excluded_port() -> None:
    promised = set(free_ports(32))
    again = free_ports(64, exclude=promised)
    assert len(set(again)) == 64
    assert not promised & set(again)


def test_a_run_of_consecutive_free_ports_starts_where_asked_if_it_can() -> None:
    from kvgate.runtime.children.ports import RUN_RANGE, free_run

    base = free_run(4)
    assert RUN_RANGE[0] <= base <= RUN_RANGE[1] - 3
    assert not any(port_in_use("127.0.0.1", p) for p in range(base, base + 4))
    assert free_run(4, first=base) == base
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 2))
        held.listen()
        moved = free_run(4, first=base)
        assert moved != base and base + 2 not in range(moved, moved + 4)
    other = free_run(2, first=base, exclude={base})
    assert base not in range(other, other + 2)
