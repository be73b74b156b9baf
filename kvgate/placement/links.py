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

A link drains at its full rate while anything is queued on it: under max-min fair sharing
(`TransferModel`) a busy link is never idle, so what is booked on it is through after its
bytes ÷ its rate. A new read is priced as if it waited for all of it (first come, first
served); fair sharing finishes a read shorter than those ahead of it sooner, so for those this
is an upper bound, and for a link with nothing booked it is exactly `EngineCost.transfer_s`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.placement.cost import GB, EngineCost


def host_of(address: str) -> str:
    """The node an engine is on, live: its host (engines on one host share its link)."""
    return address.rpartition(":")[0] or address


class LinkBacklog:
    """When the reads booked on each device's link and each node's are through."""

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
        self._device: dict[str, float] = {}  # address -> when its booked bytes are through
        self._node: dict[str, float] = {}  # node -> the same

    def _node_key(self, address: str) -> str:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = self._node_of(address)
        return node

    def wait_s(self, address: str, now: float) -> float:
        """Seconds until what is booked on `address`'s links is through."""
        device = self._device.get(address, now) - now
        if not self._node_rate:
            return max(0.0, device)
        return max(0.0, device, self._node.get(self._node_key(address), now) - now)

    def read_s(self, address: str, now: float, tokens: int) -> float:
        """Reading `tokens` into `address`'s HBM, sent now, behind what is booked on its
        links (with the transfer's fixed cost)."""
        if tokens <= 0:
            return 0.0
        size = tokens * self._bytes
        done = max(self._device.get(address, now), now) + size / self._device_rate
        if self._node_rate:
            node = self._node_key(address)
            done = max(done, max(self._node.get(node, now), now) + size / self._node_rate)
        return self._fixed + done - now

    def book(self, address: str, now: float, tokens: int) -> float:
        """A read of `tokens` into `address`'s HBM sent at `now`: queued on its links; when it
        is ready (its last byte in, plus the fixed cost)."""
        if tokens <= 0:
            return now
        size = tokens * self._bytes
        device = self._device[address] = (max(self._device.get(address, now), now)
                                          + size / self._device_rate)
        done = device
        if self._node_rate:
            node = self._node_key(address)
            end = self._node[node] = max(self._node.get(node, now), now) + size / self._node_rate
            done = max(done, end)
        return done + self._fixed

    def forget(self, address: str) -> None:
        """An engine left (or failed: its reads are gone with it)."""
        self._device.pop(address, None)
        self._nodes.pop(address, None)
