"""Leader-only: move the sessions of failed endpoints at once, and of drained endpoints once
their deadline passes, with the gateway's own placement (same KV pool first, within the pool's
load bound, spilling to other KV pools only when the siblings are full), in batches.

The control plane mirrors no binding (at a million sessions that would cost it as much memory
as an ext_proc replica, and a watch event per write): when the set of leaving endpoints of a
pool changes, the leader reads the pool's bindings once, in pages, to find theirs and the load
of every endpoint, then moves them. A sweep that found nothing to move is not repeated until
that set (or the membership) changes again, or RESCAN_S passes.

Every move is a compare-and-set on the binding that keeps its lease (its idle expiry), many per
transaction; a binding that changed meanwhile (ext_proc re-bound it first) is left as it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from kvgate.bindings.model import Binding
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, EtcdError, KeyValue
from kvgate.etcd.client import MAX_TXN_OPS, GuardedPut
from kvgate.etcd.errors import EtcdFenced
from kvgate.etcd.records import Fence
from kvgate.etcd.scan import scan
from kvgate.placement import place, session_hash
from kvgate.placement.load import PoolLoad

log = structlog.get_logger("kvgate.failover")

RESCAN_S = 300.0  # while endpoints are leaving, look again this often (a stale replica's write)
PARALLEL = 4  # move transactions in flight at once


@dataclass(frozen=True, slots=True)
class _Orphan:
    binding: Binding
    kv: KeyValue


class Failover:
    def __init__(
        self,
        client: EtcdClient,
        directory: EndpointDirectory,
        prefix: str,
        load_factor: float,
        *,
        batch: int = MAX_TXN_OPS,
        clock: Callable[[], float] = time.time,
        on_moved: Callable[[MoveReason, int], None] = lambda reason, count: None,
        fence: Callable[[], Fence | None] = lambda: None,
    ) -> None:
        self._client = client
        self._fence = fence  # the leader's: a deposed leader's moves are refused by etcd
        self._on_moved = on_moved  # counts the sessions moved, by why
        self._directory = directory
        self._base = f"{prefix}bindings/".encode()
        self._load_factor = load_factor
        self._batch = batch
        self._clock = clock
        self._done: dict[str, tuple[object, float]] = {}  # pool → (what was swept, when)
        self.moved = 0
        self.scanned = 0  # bindings read by sweeps

    def leaving(self, pool: str) -> set[str]:
        """Endpoints whose sessions must move now (besides those removed from the pool)."""
        view = self._directory.view(pool)
        now = self._clock()
        out = set()
        for member in view.members:
            record = self._directory.record(pool, member.address)
            if member.state == EndpointState.FAILED:
                out.add(member.address)
            elif member.state == EndpointState.DRAINING and record is not None:
                if record.drain_deadline is not None and record.drain_deadline <= now:
                    out.add(member.address)
        return out

    async def sweep(self) -> int:
        moved = 0
        for pool in self._directory.pools():
            leaving = self.leaving(pool)
            members = tuple(m.address for m in self._directory.view(pool).members)
            signature = (frozenset(leaving), members)
            done = self._done.get(pool)
            if done is not None and done[0] == signature and (
                    not leaving or self._clock() - done[1] < RESCAN_S):
                continue
            count, complete = await self._sweep_pool(pool, leaving, set(members))
            moved += count
            if complete:
                self._done[pool] = (signature, self._clock())
        self.moved += moved
        return moved

    def forget(self) -> None:
        """Sweep every pool afresh (on taking leadership: another leader may have stopped half
        way)."""
        self._done.clear()

    async def _sweep_pool(
        self, pool: str, leaving: set[str], members: set[str]
    ) -> tuple[int, bool]:
        """Finds the pool's bindings on leaving or removed endpoints (one paged read) and moves
        them; (moved, whether every one was dealt with)."""
        loads = PoolLoad()
        orphans: list[_Orphan] = []
        scope = self._base + f"{pool}/".encode()
        async for page, _ in scan(self._client, scope):
            self.scanned += len(page)
            for kv in page:
                try:
                    binding = Binding.decode(kv.key[len(self._base):].decode(), kv.value,
                                             kv.mod_revision)
                except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                    continue
                loads.add(binding.endpoint, 1)
                if binding.endpoint in leaving or binding.endpoint not in members:
                    orphans.append(_Orphan(binding, kv))
            await asyncio.sleep(0)
        if not orphans:
            return 0, True
        return await self._move(pool, orphans, loads)

    async def _move(
        self, pool: str, orphans: list[_Orphan], loads: PoolLoad
    ) -> tuple[int, bool]:
        view = self._directory.view(pool)
        plans: list[GuardedPut] = []
        reasons: list[MoveReason] = []
        now = self._clock()
        for orphan in orphans:
            binding = orphan.binding
            target = place(
                view, binding.hash or session_hash(binding.session.encode()), loads,
                self._load_factor,
                prefer_kv_pool=view.kv_pool_of(binding.endpoint), exclude=binding.endpoint,
            )
            if target is None:
                continue  # nowhere to go: ext_proc will place it when it next asks
            loads.add(target, 1)
            loads.add(binding.endpoint, -1)
            # Failed: its engine is gone; drained: past its deadline, or removed from the pool.
            reason = (MoveReason.FAILED if view.state(binding.endpoint) is EndpointState.FAILED
                      else MoveReason.DRAINED)
            rebound = Binding(binding.session, pool, target, hash=binding.hash, moved_at=now,
                              move_reason=reason)
            plans.append(GuardedPut(orphan.kv.key, rebound.encode(), orphan.kv.lease,
                                    orphan.kv.mod_revision))
            reasons.append(reason)
        moved = 0
        size = self._batch
        batches = [plans[i:i + size] for i in range(0, len(plans), size)]
        fence = self._fence()
        for start in range(0, len(batches), PARALLEL):
            results = await asyncio.gather(
                *(self._client.put_each(b, read_refused=False, fence=fence)
                  for b in batches[start:start + PARALLEL]), return_exceptions=True)
            for index, result in enumerate(results, start):
                if isinstance(result, EtcdFenced):
                    raise result  # no longer the leader: the sweep is the new leader's
                if isinstance(result, BaseException):
                    continue
                for offset, put in enumerate(result[0]):
                    if put.done:
                        moved += 1
                        self._on_moved(reasons[index * size + offset], 1)
            unexpected = [r for r in results
                          if isinstance(r, BaseException) and not isinstance(r, EtcdError)]
            if unexpected:
                raise unexpected[0]  # to the supervisor: logged, counted, the loop restarted
            refused = [r for r in results if isinstance(r, EtcdError)]
            if refused:  # etcd away or refusing writes: the next sweep retries
                log.warning("sessions_move_paused", pool=pool, moved=moved,
                            kind=str(refused[0].kind), error=str(refused[0]))
                if moved:
                    log.info("sessions_moved", pool=pool, moved=moved, planned=len(plans))
                return moved, False
        if moved:
            log.info("sessions_moved", pool=pool, moved=moved, planned=len(plans))
        # A move refused because the binding changed meanwhile is looked at again at once;
        # one with nowhere to go waits for the pool's states to change.
        return moved, moved == len(plans)
