"""A session's latest turn in a prefill/decode pool, in etcd for `kvgate sessions show`:
`{prefix}pd/{pool}/{session}` → `{path, decode, prefill, lacking_tokens, at}`.

Written by the ext_proc replica that served the turn, only when what happened changes (another
path, another engine) or the last write is older than half the idle TTL, so a session whose
turns all stay on its decode engine costs one write. Each record rides a lease of twice the
idle TTL, a new lease per idle TTL: records outlive their session's binding by at most that,
and nothing has to keep leases alive. A write that fails is logged and forgotten: the record is
for people, the request never waits for it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

import structlog

from kvgate.etcd import EtcdClient, EtcdError

log = structlog.get_logger("kvgate.pd")
_MAX_REMEMBERED = 100_000


@dataclass(frozen=True, slots=True)
class TurnRecord:
    path: str  # kvgate.pd.decider.Path: remote, or why the turn skipped a prefill engine
    decode: str
    prefill: str | None  # the prefill engine asked (remote, prefill_failed)
    lacking_tokens: int  # what the decode engine was estimated to lack
    at: float  # unix seconds

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, value: bytes) -> TurnRecord:
        data = json.loads(value)
        prefill = data.get("prefill")
        return cls(str(data["path"]), str(data["decode"]),
                   None if prefill is None else str(prefill), int(data["lacking_tokens"]),
                   float(data["at"]))


def turn_key(prefix: str, pool: str, session: str) -> bytes:
    return f"{prefix}pd/{pool}/{session}".encode()


class TurnLog:
    def __init__(self, client: EtcdClient, prefix: str, idle_ttl_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = max(1.0, idle_ttl_s)
        self._written: OrderedDict[tuple[str, str], tuple[str, str | None, str, float]] = (
            OrderedDict())
        self._lease: tuple[int, float] | None = None  # (lease, granted at, monotonic)
        self._tasks: set[asyncio.Task[None]] = set()

    def note(self, pool: str, session: str, record: TurnRecord) -> None:
        what = (record.path, record.prefill, record.decode)
        now = time.monotonic()
        last = self._written.get((pool, session))
        if last is not None and last[:3] == what and now - last[3] < self._ttl_s / 2:
            return
        self._written[pool, session] = (*what, now)
        self._written.move_to_end((pool, session))
        if len(self._written) > _MAX_REMEMBERED:
            self._written.popitem(last=False)
        task = asyncio.create_task(self._write(turn_key(self._prefix, pool, session), record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, key: bytes, record: TurnRecord) -> None:
        try:
            await self._client.put(key, record.encode(), lease=await self._current_lease())
        except (EtcdError, OSError) as exc:
            log.warning("pd_turn_not_recorded", key=key.decode(errors="replace"),
                        error=str(exc))

    async def _current_lease(self) -> int:
        now = time.monotonic()
        if self._lease is None or now - self._lease[1] >= self._ttl_s:
            self._lease = (await self._client.grant_lease(int(2 * self._ttl_s) + 1), now)
        return self._lease[0]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
