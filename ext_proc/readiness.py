"""Whether this replica takes decisions while a peer can: not while it is cut off from etcd (its
binding writes do not reach etcd, or its copy of the bindings is not current).

Envoy health-checks the ext_proc replicas (gRPC health, or a GET over the HTTP transport). A
replica cut off from etcd alone places sessions its peers cannot see, and they place the same
sessions again; and until its copy of the bindings has caught up it sends sessions a peer moved
meanwhile to their old engines: one session answered by two engines, back and forth
(tests/chaos/test_partitions.py). So a replica cut off reports itself not serving and Envoy
sends its requests to the peers that reach etcd. When every replica is cut off (etcd away for
all of them), the ext_proc cluster's panic threshold (control_plane.resources.clusters) sends
requests to all of them again, and each routes from its memory as before: stepping aside never
leaves Envoy without a replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("kvgate.ext_proc")

CHECK_EVERY_S = 0.1


class Readiness:
    """Follows ``cut_off`` and tells ``serving`` each change (True: take decisions)."""

    def __init__(self, cut_off: Callable[[], bool],
                 serving: Callable[[bool], Awaitable[None]],
                 every_s: float = CHECK_EVERY_S) -> None:
        self._cut_off = cut_off
        self._serving = serving
        self._every_s = every_s
        self.ready = True

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._every_s)

    async def check(self) -> None:
        ready = not self._cut_off()
        if ready != self.ready:
            await self._serving(ready)
            self.ready = ready
            if ready:
                log.info("ext_proc_serving_again", reason="etcd reachable")
            else:
                log.warning("ext_proc_stepped_aside",
                            reason="cut off from etcd: bindings degraded or their copy stale",
                            effect="Envoy sends decisions to the replicas that reach etcd")
