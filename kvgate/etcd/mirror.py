"""Keep a local copy of one etcd prefix: list it (in pages), then watch from that revision; on
any loss, keep serving the last copy, relist and watch again, with backoff.

Its state is always known (`MirrorState`): never "synced" while it is listing or has lost its
watch; the reason it is not synced is kept, logged once per change of kind, and shown in metrics
(`kvgate_etcd_mirror_synced{service,mirror}`) and `kvgate status`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

import structlog

from kvgate.etcd.client import EtcdClient, KeyValue, WatchEvent
from kvgate.etcd.errors import EtcdCompacted, EtcdError, EtcdUnavailable
from kvgate.etcd.scan import scan

log = structlog.get_logger("kvgate.etcd")

SLICE = 1000  # watch events applied between two yields to the event loop


class MirrorState(StrEnum):
    STARTING = "starting"  # nothing listed yet
    LISTING = "listing"  # reading the prefix (again); the last copy is still served
    SYNCED = "synced"  # listed, and watching every change since
    STALE = "stale"  # lost etcd (the reason is kept); the last copy is served, retrying


class MirrorHandler(Protocol):
    """Receives the prefix's content: a full listing, then every change after it."""

    def reset(self, kvs: list[KeyValue]) -> None: ...

    def apply(self, event: WatchEvent) -> object: ...  # what it returns is its own business


@runtime_checkable
class PagedHandler(Protocol):
    """A handler for a large prefix: takes the listing page by page, in place, and finishes it
    (dropping what the listing no longer holds) at its own pace."""

    def begin_listing(self) -> None: ...

    def listed(self, kvs: list[KeyValue]) -> None: ...

    async def end_listing(self, revision: int) -> int: ...

    def apply(self, event: WatchEvent) -> object: ...


@dataclass(frozen=True, slots=True)
class MirrorStatus:
    """One mirror, as `kvgate status` shows it."""

    name: str
    state: MirrorState
    since: float  # unix time of the last change of state
    revision: int  # the etcd revision its copy is at
    relists: int  # listings after the first
    error: str | None  # why it is not synced, when it is not and etcd said why


class PrefixMirror:
    def __init__(
        self, client: EtcdClient, prefix: bytes, handler: MirrorHandler | PagedHandler,
        name: str = "",
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._handler = handler
        self.name = name or prefix.decode(errors="replace")
        self.synced = asyncio.Event()  # set once the first listing has been applied
        self.state = MirrorState.STARTING
        self.since = time.time()
        self.revision = 0
        self.relists = 0
        self.last_error: EtcdError | None = None  # why it is not synced, when it is not

    @property
    def connected(self) -> bool:
        return self.state == MirrorState.SYNCED

    def status(self) -> MirrorStatus:
        error = None if self.state == MirrorState.SYNCED or self.last_error is None \
            else str(self.last_error)
        return MirrorStatus(self.name, self.state, self.since, self.revision, self.relists, error)

    def _set(self, state: MirrorState) -> None:
        if state != self.state:
            self.state = state
            self.since = time.time()

    async def run(self) -> None:
        """Runs until cancelled; an etcd failure of any kind only pauses it, named in the log
        once per change of kind. Anything else propagates (to the service's supervisor)."""
        try:
            await self._run()
        finally:
            if self.state != MirrorState.STARTING:
                self._set(MirrorState.STALE)  # a mirror that is not running is not synced

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self.synced.is_set():
                    self.relists += 1
                if self.state != MirrorState.STARTING:
                    self._set(MirrorState.LISTING)
                revision, keys = await self._list()
                self.revision = revision
                self.synced.set()
                if self.state != MirrorState.SYNCED:
                    log.info("etcd_mirror_synced", mirror=self.name, keys=keys,
                             revision=revision, relists=self.relists)
                self._set(MirrorState.SYNCED)
                self.last_error = None
                backoff = 0.1
                async for events, seen in self._client.watch_prefix(self._prefix, revision + 1):
                    for start in range(0, len(events), SLICE):
                        if start:
                            await asyncio.sleep(0)  # a lease expiring 100k keys is many slices
                        for event in events[start:start + SLICE]:
                            self._handler.apply(event)
                    if seen:
                        self.revision = seen
            except EtcdCompacted as exc:
                # The listing outlived the revision it started at: read again at once.
                self._lost(exc, 0.0)
            except EtcdError as exc:
                # An outage heals by itself; refused credentials or a size limit need an
                # operator, so those are retried less often.
                self._lost(exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0 if isinstance(exc, EtcdUnavailable) else 10.0)

    async def _list(self) -> tuple[int, int]:
        """Reads the whole prefix at one revision, page by page (a large one in windows:
        kvgate.etcd.scan); returns (revision, keys)."""
        revision = keys = 0
        if isinstance(self._handler, PagedHandler):
            self._handler.begin_listing()
            async for page, at in scan(self._client, self._prefix):
                revision = at
                self._handler.listed(page)
                keys += len(page)
                await asyncio.sleep(0)  # decisions go on between pages
            await self._handler.end_listing(revision)
            return revision, keys
        kvs: list[KeyValue] = []
        async for page, at in self._client.pages(self._prefix):
            kvs.extend(page)
            revision = at
        self._handler.reset(kvs)
        return revision, len(kvs)

    def _lost(self, exc: EtcdError, retry_in: float) -> None:
        if (self.state == MirrorState.SYNCED or self.last_error is None
                or self.last_error.kind != exc.kind):
            log.warning("etcd_mirror_lost", mirror=self.name, prefix=self._prefix.decode(),
                        kind=str(exc.kind), error=str(exc), retry_in_s=retry_in,
                        serving="the last copy" if self.synced.is_set() else "nothing yet")
        self._set(MirrorState.STALE)
        self.last_error = exc
