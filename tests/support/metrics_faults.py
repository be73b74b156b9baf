"""An upstream whose /metrics the test controls: honest (an idle engine), hanging, slow, or lying
(a deep queue it does not have), switchable while traffic runs. Everything else is answered as
tests/support/upstreams.py answers it."""

from __future__ import annotations

import asyncio
from enum import StrEnum

from aiohttp import web

from tests.support.upstreams import Upstream

SLOW_S = 3.0  # longer than any scrape waits, and than a figure may age


class MetricsFault(StrEnum):
    NONE = "none"  # an idle engine: nothing waiting or running
    HANG = "hang"  # never answers
    SLOW = "slow"  # answers, SLOW_S late
    DEEP_QUEUE = "deep-queue"  # claims a thousand requests waiting


def metrics_page(waiting: int, running: int = 0, usage: float = 0.0) -> str:
    return (f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running {running}\n"
            f"vllm:kv_cache_usage_perc {usage}\n")


class FaultyMetricsUpstream(Upstream):
    def __init__(self, fault: MetricsFault = MetricsFault.NONE) -> None:
        super().__init__()
        self.fault = fault
        self.scrapes = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path not in ("/metrics", "/metrics/"):
            return await super()._handle(request)
        self.scrapes += 1
        if self.fault is MetricsFault.HANG:
            await asyncio.Event().wait()  # until the server is stopped
        if self.fault is MetricsFault.SLOW:
            await asyncio.sleep(SLOW_S)
        waiting = 1000 if self.fault is MetricsFault.DEEP_QUEUE else 0
        return web.Response(text=metrics_page(waiting))
