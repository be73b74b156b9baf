"""Leader-only: move the sessions of failed endpoints at once, and of drained endpoints once
their deadline passes, with the gateway's own placement (same KV pool first, within the pool's
load bound, spilling to other KV pools only when the siblings are full), in batches.

Every move is a compare-and-set on the binding that keeps its lease (its idle expiry); a
binding that changed meanwhile (ext_proc re-bound it first) is left as it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from kvgate.bindings.mirror import BindingMirror
from kvgate.bindings.model import Binding
from kvgate.contract.states import EndpointState
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.placement import place, session_hash
from kvgate.placement.load import PoolLoad

log = structlog.get_logger("kvgate.failover")


class Failover:
    def __init__(
        self,
        client: EtcdClient,
        directory: EndpointDirectory,
        bindings: BindingMirror,
        load_factor: float,
        *,
        batch: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._directory = directory
        self._bindings = bindings
        self._load_factor = load_factor
        self._batch = batch
        self._clock = clock
        self.moved = 0

    def leaving(self, pool: str) -> set[str]:
        """Endpoints whose sessions must move now."""
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
        known = {m.address for m in view.members}
        out |= set(self._bindings.index.load(pool)) - known  # removed from the config
        return out

    async def sweep(self) -> int:
        moved = 0
        for pool in self._directory.pools():
            leaving = self.leaving(pool)
            if not leaving:
                continue
            orphans = [b for b in self._bindings.index.bindings(pool) if b.endpoint in leaving]
            if orphans:
                moved += await self._move(pool, orphans)
        self.moved += moved
        return moved

    async def _move(self, pool: str, orphans: list[Binding]) -> int:
        view = self._directory.view(pool)
        loads = PoolLoad()  # what the moves below leave behind, kept as they are planned
        for endpoint, count in self._bindings.index.load(pool).items():
            loads.add(endpoint, count)
        plans: list[tuple[Binding, str]] = []
        for binding in orphans:
            target = place(
                view, binding.hash or session_hash(binding.session.encode()), loads,
                self._load_factor,
                prefer_kv_pool=view.kv_pool_of(binding.endpoint), exclude=binding.endpoint,
            )
            if target is None:
                continue  # nowhere to go: ext_proc will place it when it next asks
            loads.add(target, 1)
            loads.add(binding.endpoint, -1)
            plans.append((binding, target))
        moved = 0
        for start in range(0, len(plans), self._batch):
            results = await asyncio.gather(
                *(self._cas(b, t) for b, t in plans[start:start + self._batch]),
                return_exceptions=True,
            )
            moved += sum(1 for r in results if r is True)
            unexpected = [r for r in results
                          if isinstance(r, BaseException) and not isinstance(r, EtcdError)]
            if unexpected:
                raise unexpected[0]  # to the supervisor: logged, counted, the loop restarted
            refused = [r for r in results if isinstance(r, EtcdError)]
            if refused:  # etcd away or refusing writes: the next sweep retries
                log.warning("sessions_move_paused", pool=pool, moved=moved,
                            kind=str(refused[0].kind), error=str(refused[0]))
                break
        if moved:
            log.info("sessions_moved", pool=pool, moved=moved, planned=len(plans))
        return moved

    async def _cas(self, binding: Binding, target: str) -> bool:
        key = f"{self._bindings.prefix.decode()}{binding.key}".encode()
        lease = self._bindings.leases.get(binding.key, 0)
        moved = Binding(binding.session, binding.pool, target, hash=binding.hash)
        done, _ = await self._client.replace(key, moved.encode(), binding.revision, lease)
        return done
