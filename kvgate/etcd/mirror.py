"""Keep a local copy of one etcd prefix: list it, then watch from that revision; relist on loss."""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog

from kvgate.etcd.client import EtcdClient, KeyValue, WatchEvent
from kvgate.etcd.errors import EtcdError, EtcdUnavailable

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
        self.last_error: EtcdError | None = None  # why it is not connected, when it is not

    async def run(self) -> None:
        """Runs until cancelled; an etcd failure of any kind only pauses it, named in the log
        once per change of kind. Anything else propagates (to the service's supervisor)."""
        try:
            await self._run()
        finally:
            self.connected = False  # a mirror that is not running is not connected

    async def _run(self) -> None:
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
                self.last_error = None
                backoff = 0.1
                async for events, seen in self._client.watch_prefix(self._prefix, revision + 1):
                    for event in events:
                        self._handler.apply(event)
                    self.revision = seen
            except EtcdError as exc:
                if self.connected or self.last_error is None or self.last_error.kind != exc.kind:
                    log.warning("etcd_mirror_lost", prefix=self._prefix.decode(),
                                kind=str(exc.kind), error=str(exc))
                self.connected = False
                self.last_error = exc
                await asyncio.sleep(backoff)
                # An outage heals by itself; refused credentials or a size limit need an operator,
                # so those are retried less often.
                backoff = min(backoff * 2, 2.0 if isinstance(exc, EtcdUnavailable) else 10.0)
