"""Keep a local copy of one etcd prefix: list it, then watch from that revision; relist on loss."""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog

from kvgate.etcd.client import EtcdClient, EtcdUnavailable, KeyValue, WatchEvent

log = structlog.get_logger("kvgate.etcd")


class MirrorHandler(Protocol):
    """Receives the prefix's content: a full listing, then every change after it."""

    def reset(self, kvs: list[KeyValue]) -> None: ...

    def apply(self, event: WatchEvent) -> object: ...  # what it returns is its own business


class PrefixMirror:
    def __init__(self, client: EtcdClient, prefix: bytes, handler: MirrorHandler) -> None:
        self._client = client
        self._prefix = prefix
        self._handler = handler
        self.synced = asyncio.Event()  # set once the first listing has been applied
        self.connected = False
        self.revision = 0

    async def run(self) -> None:
        """Runs until cancelled; etcd outages only pause it."""
        backoff = 0.1
        while True:
            try:
                kvs, revision = await self._client.get_prefix(self._prefix)
                self._handler.reset(kvs)
                self.revision = revision
                self.synced.set()
                if not self.connected:
                    log.info("etcd_mirror_synced", prefix=self._prefix.decode(), keys=len(kvs))
                self.connected = True
                backoff = 0.1
                async for events, seen in self._client.watch_prefix(self._prefix, revision + 1):
                    for event in events:
                        self._handler.apply(event)
                    self.revision = seen
            except EtcdUnavailable as exc:
                if self.connected:
                    log.warning("etcd_mirror_lost", prefix=self._prefix.decode(), error=str(exc))
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
