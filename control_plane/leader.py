"""One leader among control-plane replicas: a lease-backed etcd key, created only if absent.

The leader keeps its lease alive; if it dies, the lease (and key) expire within `ttl` seconds
and a follower, which checks every `ttl / 3`, takes over. A leader cut off or paused past its
lease may not know yet that it lost the lead: its writes carry a fence (`fence()`: the key still
on its lease), so etcd refuses them rather than let two leaders act.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.records import Fence

log = structlog.get_logger("kvgate.leader")


class LeaderElection:
    def __init__(
        self, client: EtcdClient, key: bytes, identity: str, ttl: int = 3,
        on_change: Callable[[bool], None] = lambda leading: None,
    ) -> None:
        self._client = client
        self._key = key
        self.identity = identity
        self._ttl = ttl
        self._on_change = on_change
        self.leading = False
        self.leader: str | None = None
        self._lease = 0

    async def run(self) -> None:
        """Runs until cancelled; an etcd failure of any kind makes this replica step down until
        etcd answers again. Whatever ends it also ends its leadership."""
        try:
            while True:
                try:
                    await self._round()
                except EtcdError as exc:
                    log.warning("leader_election_etcd", kind=str(exc.kind), error=str(exc))
                    self._set(False, None)
                await asyncio.sleep(self._ttl / 3)
        finally:
            if self.leading and self._lease:
                # hand over at once instead of making followers wait for the lease
                with contextlib.suppress(EtcdError):
                    await self._client.revoke_lease(self._lease)
                self._lease = 0
            self._set(False, None)

    async def _round(self) -> None:
        if self.leading:
            if await self._client.keep_alive_once(self._lease) > 0:
                return
            log.warning("leadership_lost", identity=self.identity)
            self._set(False, None)
        holder = await self._client.get(self._key)
        if holder is not None:
            self._set(False, holder.value.decode(errors="replace"))
            return
        self._lease = await self._client.grant_lease(self._ttl)
        created, current = await self._client.create(self._key, self.identity.encode(),
                                                     self._lease)
        if created:
            self._set(True, self.identity)
            return
        await self._client.revoke_lease(self._lease)
        self._lease = 0
        self._set(False, current.value.decode() if current is not None else None)

    def fence(self) -> Fence | None:
        """What this replica's leader-only writes are conditioned on (None: it does not lead):
        etcd refuses them once the election key is no longer on this replica's lease, even
        before this replica learns that it lost the lead."""
        return Fence(self._key, self._lease) if self.leading and self._lease else None

    def _set(self, leading: bool, leader: str | None) -> None:
        changed = leading != self.leading
        self.leading = leading
        self.leader = leader
        if changed:
            log.info("leadership", identity=self.identity, leading=leading)
            self._on_change(leading)
