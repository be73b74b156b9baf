"""The tests' ports: a block per worker below the ephemeral range, walked in order."""

from __future__ import annotations

import socket

from tests.support.ports import BLOCK, FIRST, PortWalk, _ephemeral_low, free_ports


def test_a_walk_hands_no_port_out_twice_before_its_block_wraps() -> None:
    walk = PortWalk(FIRST, FIRST + BLOCK - 1)
    seen = walk.take(40, "127.0.0.1", ()) + walk.take(40, "127.0.0.1", ())
    assert len(set(seen)) == 80
    assert all(FIRST <= port < FIRST + BLOCK for port in seen)


def test_a_walk_skips_a_port_something_holds_and_an_excluded_one() -> None:
    walk = PortWalk(FIRST, FIRST + BLOCK - 1)
    start = walk.next
    following = FIRST if start == FIRST + BLOCK - 1 else start + 1
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", start))
        except OSError:
            pass  # something else holds it already: to be skipped all the same
        ports = walk.take(2, "127.0.0.1", exclude={following})
    assert start not in ports and following not in ports


def test_the_suites_ports_lie_below_the_ephemeral_range() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert all(port < _ephemeral_low() for port in ports)
