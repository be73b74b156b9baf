"""The DDR reads this router caused, queued on the links they cross: each device's link from
the pool and its node's, as the emulator's and the simulator's transfer model has them
(emulator/transfer.py, `TransferModel`: device, node and pool links, engine `i` on node
`i // devices_per_node`).

The gateway books a read when it sends a request whose context comes from the pool first: a
session moved or re-homed within its DDR pool (its whole context), or kept on an engine whose
HBM has lost part of it (that part, where the engines' KV events say so). No pool or connector
kvgate reads reports a link's queued bytes: vLLM's `/metrics` counts the connector's hits
(`vllm:external_prefix_cache_hits`, kvgate.contract.vllm) and its `KVConnectorStats`
(vllm/distributed/kv_transfer/kv_connector/v1/metrics.py) transfers done, not bytes waiting;
so these reads are all it knows.

The links share their bandwidth as `TransferModel` does: max-min fair, which on one bottleneck
is processor sharing (`TransferModel`'s docstring). So each link here is processor sharing
among the reads booked on it: every read in flight moves at the link's rate over their number.
A read of `b` bytes sent now, with nothing sent after it, is through once each read ahead has
moved as much of itself as it has, at most `b`: after (sum of min(left_i, b) + b) / rate
(the same as `TransferModel.estimate` on one link). A node's link is a second constraint: the
later of the two. A link is never idle while anything is on it, so what is booked is through
after its bytes / its rate (`wait_s`). For a link with nothing booked a read costs exactly
`EngineCost.transfer_s`. Each link's reads drain on it alone (a device's reads slowed by a busy
node are not slowed here): the model is exact on one link and optimistic across two.
Measured against the simulator's transfers: docs/journal/agentic-peak.md (2026-12-07, the link
term's error).
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Callable

from kvgate.placement.cost import GB, EngineCost


def host_of(address: str) -> str:
    """The node an engine is on, live: its host (engines on one host share its link)."""
    return address.rpartition(":")[0] or address


class SharedLink:
    """One link's booked reads under processor sharing, in virtual time: `moved` is what each
    read in flight has moved since the first booked; a read is through when `moved` reaches
    its tag (what had moved when it was booked, plus its bytes). Tags are kept sorted, so the
    reads finish in their order. A call whose `now` is before the last is taken at the last
    (live, two streams may read their clocks slightly out of order)."""

    __slots__ = ("_end", "_moved", "_rate", "_since", "_tags")

    def __init__(self, rate: float) -> None:
        self._rate = rate  # bytes/s
        self._tags: list[float] = []  # sorted
        self._moved = 0.0  # at `_since`
        self._since = -math.inf
        self._end = -math.inf  # when all of it is through: the link is never idle meanwhile

    def wait_s(self, now: float) -> float:
        """Seconds until what is booked on the link is through."""
        return max(0.0, self._end - now)

    def _advance(self, now: float) -> None:
        """Brings `moved` to `now` and drops the reads through by then."""
        tags, rate = self._tags, self._rate
        moved, at, first = self._moved, self._since, 0
        if now <= at:
            return
        while first < len(tags):
            sharing = len(tags) - first
            end = at + (tags[first] - moved) * sharing / rate
            if end > now:
                moved += (now - at) * rate / sharing
                break
            at, moved = end, tags[first]
            first += 1
        del tags[:first]
        self._moved, self._since = moved, now

    def read_s(self, now: float, size: float) -> float:
        """Seconds until a read of `size` bytes sent at `now` is through, if none is sent
        after it: the reads ahead move min(left, size) each meanwhile."""
        if self._end <= now:  # nothing left on the link: the sticky path's usual case
            return size / self._rate
        self._advance(now)
        moved = self._moved
        ahead = 0.0
        for tag in self._tags:
            ahead += min(tag - moved, size)
        return (ahead + size) / self._rate

    def book(self, now: float, size: float) -> float:
        """A read of `size` bytes sent at `now`; seconds until it is through (as `read_s`)."""
        seconds = self.read_s(now, size)
        self._advance(now)
        insort(self._tags, self._moved + size)
        self._end = max(self._end, now) + size / self._rate
        return seconds


class LinkBacklog:
    """The reads booked on each device's link and each node's, shared as the links share."""

    __slots__ = ("_bytes", "_device", "_device_rate", "_fixed", "_node", "_node_of",
                 "_node_rate", "_nodes")

    def __init__(self, cost: EngineCost, node_of: Callable[[str], str] = host_of) -> None:
        """`cost`: the links' rates (`ddr_gbps`, `node_gbps`: 0, no node link but the devices');
        `node_of`: an engine's node from its address."""
        self._bytes = cost.kv_bytes_per_token
        self._fixed = cost.transfer_fixed_s
        self._device_rate = cost.ddr_gbps * GB
        self._node_rate = cost.node_gbps * GB
        self._node_of = node_of
        self._nodes: dict[str, str] = {}  # address -> node, as first asked
        self._device: dict[str, SharedLink] = {}  # address -> its device link's reads
        self._node: dict[str, SharedLink] = {}  # node -> its link's reads

    def _node_key(self, address: str) -> str:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = self._node_of(address)
        return node

    def wait_s(self, address: str, now: float) -> float:
        """Seconds until what is booked on `address`'s links is through."""
        device = self._device.get(address)
        wait = 0.0 if device is None else device.wait_s(now)
        if self._node_rate:
            node = self._node.get(self._node_key(address))
            if node is not None:
                wait = max(wait, node.wait_s(now))
        return wait

    def read_s(self, address: str, now: float, tokens: int) -> float:
        """Reading `tokens` into `address`'s HBM, sent now, sharing its links with what is
        booked on them (with the transfer's fixed cost)."""
        if tokens <= 0:
            return 0.0
        size = tokens * self._bytes
        device = self._device.get(address)
        seconds = size / self._device_rate if device is None else device.read_s(now, size)
        if self._node_rate:
            node = self._node.get(self._node_key(address))
            seconds = max(seconds, size / self._node_rate if node is None
                          else node.read_s(now, size))
        return self._fixed + seconds

    def book(self, address: str, now: float, tokens: int) -> float:
        """A read of `tokens` into `address`'s HBM sent at `now`: booked on its links; when it
        is ready (its last byte in, plus the fixed cost), if no read is sent after it."""
        if tokens <= 0:
            return now
        size = tokens * self._bytes
        device = self._device.get(address)
        if device is None:
            device = self._device[address] = SharedLink(self._device_rate)
        seconds = device.book(now, size)
        if self._node_rate:
            node_key = self._node_key(address)
            node = self._node.get(node_key)
            if node is None:
                node = self._node[node_key] = SharedLink(self._node_rate)
            seconds = max(seconds, node.book(now, size))
        return now + seconds + self._fixed

    def forget(self, address: str) -> None:
        """An engine left (or failed: its reads are gone with it)."""
        self._device.pop(address, None)
        self._nodes.pop(address, None)
