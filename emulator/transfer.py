"""DDR pool -> HBM transfers on shared links: one model for the emulator and the simulator.

Pure: no I/O, no clock of its own; every call takes ``now`` in emulated seconds and calls must not
go back in time. Engines are grouped into nodes (``devices_per_node``, engine ``i`` on node
``i // devices_per_node``). A transfer crosses three links: its device's (``device_gbps``), its
node's aggregate (``node_gbps``) and, optionally, a pool-wide aggregate (``pool_gbps``).

Sharing is **max-min fair** (progressive filling), recomputed whenever a transfer starts or ends:
every transfer's rate rises together until a link it crosses is full; the transfers on that link
keep that rate and the others go on rising. Why max-min rather than plain processor sharing per
link: with two levels (device, node) a transfer alone on its device but on a busy node must get
the node's spare bandwidth, not a fixed 1/n of every link, or the model would waste bandwidth a
real RDMA fabric (per-flow fair queueing at the NIC and switch) hands out. Max-min is what
per-flow fair queueing converges to, and on a single bottleneck it is processor sharing.

Each transfer also pays ``fixed_ms`` (lookup in the pool's metadata service, RDMA set-up, the
kernel that scatters blocks into the paged cache), which uses no bandwidth: a transfer is *ready*
``fixed_ms`` after its last byte. ``estimate`` gives the time a transfer starting now would take
if nothing else started or ended meanwhile (what a router gate can use to price a move).

It also records each node's traffic per ``bin_s`` window, for the pool's GB/s (mean, peak) and
the links' utilisation (``traffic``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

GB = 1e9


@dataclass(frozen=True, slots=True)
class TransferParams:
    """Link bandwidths (GB/s, decimal), nodes and the fixed cost. Defaults and their sources:
    docs/benchmarks.md ("The fleet and the DDR pool")."""

    device_gbps: float = 20.0  # one device's link from the pool
    node_gbps: float | None = 144.0  # a node's aggregate (None: devices x device_gbps)
    pool_gbps: float | None = None  # the whole pool's aggregate (None: no limit)
    devices_per_node: int = 8
    fixed_ms: float = 3.0

    def problems(self) -> list[str]:
        """What is wrong, each naming its field; empty when usable."""
        checks = (
            (self.device_gbps > 0, "device_gbps must be > 0"),
            (self.node_gbps is None or self.node_gbps > 0, "node_gbps must be > 0"),
            (self.pool_gbps is None or self.pool_gbps > 0, "pool_gbps must be > 0"),
            (self.devices_per_node >= 1, "devices_per_node must be >= 1"),
            (self.fixed_ms >= 0, "fixed_ms must be >= 0"),
        )
        return [text for ok, text in checks if not ok]

    @property
    def fixed_s(self) -> float:
        return self.fixed_ms / 1000.0

    @property
    def node_capacity_gbps(self) -> float:
        """What one node can move at once: its aggregate, or all its devices' links."""
        links = self.devices_per_node * self.device_gbps
        return links if self.node_gbps is None else min(self.node_gbps, links)

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node


@dataclass(slots=True)
class _Transfer:
    tid: int
    device: int
    node: int
    left: float  # bytes still to move
    rate: float = 0.0  # bytes/s since ``since``
    since: float = 0.0
    version: int = 0


@dataclass(slots=True)
class Traffic:
    """Bytes moved per node and per ``bin_s`` window."""

    bin_s: float
    node_bytes: dict[int, dict[int, float]] = field(default_factory=dict)  # node -> bin -> bytes

    def add(self, node: int, t0: float, t1: float, rate: float) -> None:
        """``rate`` bytes/s on ``node`` from ``t0`` to ``t1``, spread over the windows."""
        if rate <= 0 or t1 <= t0:
            return
        bins = self.node_bytes.setdefault(node, {})
        b, last = int(t0 // self.bin_s), int(t1 // self.bin_s)
        while b <= last:
            lo, hi = max(t0, b * self.bin_s), min(t1, (b + 1) * self.bin_s)
            if hi > lo:
                bins[b] = bins.get(b, 0.0) + rate * (hi - lo)
            b += 1

    def pool_gbps(self, start: float, end: float) -> list[float]:
        """The whole pool's GB/s in each window from ``start`` to ``end``."""
        first, last = int(start // self.bin_s), math.ceil(end / self.bin_s)
        totals = [0.0] * max(0, last - first)
        for bins in self.node_bytes.values():
            for b, moved in bins.items():
                if first <= b < last:
                    totals[b - first] += moved
        return [moved / self.bin_s / GB for moved in totals]

    def node_utilisation(self, nodes: int, capacity_gbps: float, start: float,
                         end: float) -> list[float]:
        """Every node's share of its capacity in every window from ``start`` to ``end``
        (idle windows count, as zeros)."""
        first, last = int(start // self.bin_s), math.ceil(end / self.bin_s)
        full = capacity_gbps * GB * self.bin_s
        values: list[float] = []
        for node in range(nodes):
            bins = self.node_bytes.get(node, {})
            values.extend(bins.get(b, 0.0) / full for b in range(first, last))
        return values


class TransferModel:
    """Transfers in flight, their max-min fair rates, and when each is done."""

    def __init__(self, params: TransferParams, bin_s: float = 1.0) -> None:
        problems = params.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.params = params
        self.factor = 1.0  # the share of every link's bandwidth left (a degraded pool < 1)
        self.traffic = Traffic(bin_s)
        self.bytes_moved = 0.0
        self.transfers_started = 0
        self._active: dict[int, _Transfer] = {}
        self._by_node: dict[int, set[int]] = {}
        self._done: list[tuple[float, int, int]] = []  # (data end, id, version), lazily stale
        self._next_id = 0
        self._node_rate: dict[int, float] = {}
        self._node_since: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._active)

    # ---- the caller's view ------------------------------------------------------------------

    def start(self, now: float, device: int, nbytes: float) -> int:
        """A transfer of ``nbytes`` to ``device`` starts at ``now``; returns its id."""
        tid = self._next_id
        self._next_id += 1
        self.transfers_started += 1
        node = self.params.node_of(device)
        self._active[tid] = _Transfer(tid, device, node, max(0.0, float(nbytes)), since=now)
        self._by_node.setdefault(node, set()).add(tid)
        self._reshare(now, node)
        return tid

    def next_done(self) -> float:
        """When the earliest transfer's last byte arrives (``inf`` when none is in flight)."""
        done = self._done
        while done:
            end, tid, version = done[0]
            t = self._active.get(tid)
            if t is not None and t.version == version:
                return end
            heapq.heappop(done)
        return math.inf

    def finish_due(self, now: float) -> list[tuple[int, float]]:
        """Transfers whose last byte arrived by ``now``, as ``(id, ready time)``, in order;
        ready = last byte + the fixed cost. The survivors' rates are shared out again."""
        finished: list[tuple[int, float]] = []
        while (end := self.next_done()) <= now:
            _, tid, _ = heapq.heappop(self._done)
            node = self._active[tid].node
            self._settle(end, node)
            t = self._active.pop(tid)
            self._by_node[node].discard(tid)
            self.bytes_moved += t.left  # what rounding left over
            self._reshare(end, node)
            finished.append((tid, end + self.params.fixed_s))
        return finished

    def estimate(self, now: float, device: int, nbytes: float) -> float:
        """Seconds a transfer of ``nbytes`` to ``device`` starting at ``now`` would take (fixed
        cost included) at the fair share it would get among the transfers in flight, if none
        started or ended meanwhile. Nothing is changed."""
        if nbytes <= 0:
            return self.params.fixed_s
        node = self.params.node_of(device)
        probe = _Transfer(-1, device, node, float(nbytes), since=now)
        group = [*self._group(node), probe]
        rates = self._fair_rates(group)
        return self.params.fixed_s + nbytes / rates[-1]

    def set_factor(self, now: float, factor: float) -> None:
        """Every link keeps ``factor`` of its bandwidth from ``now`` (a degraded pool)."""
        if not factor > 0:
            raise ValueError(f"bandwidth factor must be > 0, got {factor:g}")
        self.factor = factor
        for node in list(self._by_node):
            self._settle(now, node)
        for node in self._groups_of_all():
            self._reshare(now, node)

    # ---- sharing ------------------------------------------------------------------------------

    def _group(self, node: int) -> list[_Transfer]:
        """The transfers whose rates depend on each other's: one node's, or all with a pool cap."""
        if self.params.pool_gbps is not None:
            return list(self._active.values())
        return [self._active[tid] for tid in self._by_node.get(node, ())]

    def _groups_of_all(self) -> Iterable[int]:
        if self.params.pool_gbps is not None:
            return [next(iter(self._active.values())).node] if self._active else []
        return [node for node, tids in self._by_node.items() if tids]

    def _settle(self, now: float, node: int) -> None:
        """Bring the transfers of ``node``'s group to ``now``: bytes moved, traffic recorded."""
        for t in self._group(node):
            if now > t.since:
                moved = min(t.left, t.rate * (now - t.since))
                t.left -= moved
                self.bytes_moved += moved
                t.since = now
        nodes = self._node_rate if self.params.pool_gbps is not None else (
            {node: self._node_rate.get(node, 0.0)})
        for n in list(nodes):
            since = self._node_since.get(n, now)
            self.traffic.add(n, since, now, self._node_rate.get(n, 0.0))
            self._node_since[n] = now

    def _reshare(self, now: float, node: int) -> None:
        self._settle(now, node)
        group = self._group(node)
        rates = self._fair_rates(group)
        touched = {node} if self.params.pool_gbps is None else set(self._node_rate)
        per_node: dict[int, float] = dict.fromkeys(touched, 0.0)
        for t, rate in zip(group, rates, strict=True):
            t.rate = rate
            t.since = now
            t.version += 1
            per_node[t.node] = per_node.get(t.node, 0.0) + rate
            end = now + (t.left / rate if rate > 0 else math.inf)
            heapq.heappush(self._done, (end, t.tid, t.version))
        for n, rate in per_node.items():
            self._node_rate[n] = rate
            self._node_since[n] = now

    def _fair_rates(self, group: list[_Transfer]) -> list[float]:
        """Max-min fair rates (bytes/s) of ``group``, by progressive filling."""
        if not group:
            return []
        p, f = self.params, self.factor
        capacity: dict[tuple[str, int], float] = {}
        users: dict[tuple[str, int], list[int]] = {}
        links: list[list[tuple[str, int]]] = []
        for k, t in enumerate(group):
            mine = [("d", t.device)]
            capacity[("d", t.device)] = p.device_gbps * GB * f
            if p.node_gbps is not None:
                mine.append(("n", t.node))
                capacity[("n", t.node)] = p.node_gbps * GB * f
            if p.pool_gbps is not None:
                mine.append(("p", 0))
                capacity[("p", 0)] = p.pool_gbps * GB * f
            links.append(mine)
            for link in mine:
                users.setdefault(link, []).append(k)
        left = dict(capacity)
        count = {link: len(ks) for link, ks in users.items()}
        rates = [0.0] * len(group)
        frozen = [False] * len(group)
        level = 0.0
        unfrozen = len(group)
        while unfrozen:
            step = min(left[link] / n for link, n in count.items() if n > 0)
            level += step
            for link, n in count.items():
                if n > 0:
                    left[link] -= step * n
            for link, n in list(count.items()):
                if n > 0 and left[link] <= 1e-9 * capacity[link]:
                    for k in users[link]:
                        if not frozen[k]:
                            frozen[k] = True
                            unfrozen -= 1
                            rates[k] = level
                            for other in links[k]:
                                count[other] -= 1
        return rates

