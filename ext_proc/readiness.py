"""Whether this replica takes decisions while a peer can: not while its binding store cannot
reach etcd.

Envoy health-checks the ext_proc replicas (gRPC health, or a GET over the HTTP transport). A
replica cut off from etcd alone places sessions its peers cannot see, and they place the same
sessions again: one session answered by two engines (tests/chaos/test_partitions.py). So a
degraded replica reports itself not serving and Envoy sends its requests to the peers that reach
etcd. When every replica is degraded (etcd away for all of them), the ext_proc cluster's panic
threshold (control_plane.resources.clusters) sends requests to all of them again, and each
routes from its memory as before: stepping aside never leaves Envoy without a replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("kvgate.ext_proc")

CHECK_EVERY_S = 0.1


class Readiness:
    """Follows ``degraded`` and tells ``serving`` each change (True: take decisions)."""

    def __init__(self, degraded: Callable[[], bool],
                 serving: Callable[[bool], Awaitable[None]],
                 every_s: float = CHECK_EVERY_S) -> None:
        self._degraded = degraded
        self._serving = serving
        self._every_s = every_s
        self.ready = True

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._every_s)

    async def check(self) -> None:
        ready = not self._degraded()
        if ready != self.ready:
            await self._serving(ready)
            self.ready = ready
            if ready:
                log.info("ext_proc_serving_again", reason="etcd reachable")
            else:
                log.warning("ext_proc_stepped_aside", reason="etcd unreachable: bindings degraded",
                            effect="Envoy sends decisions to the replicas that reach etcd")
