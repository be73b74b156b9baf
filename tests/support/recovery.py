"""Whether the gateway decides on bindings, sampled all through a fault run: how long after the
fault ended it was back (the issue's recovery time).

It is back when Envoy counts every ext_proc replica healthy (a replica that cannot reach etcd
steps aside, and Envoy then routes its requests on its own ring, binding nothing) and no replica
is degraded or holds bindings etcd has not taken yet."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.contract.envoy import EXT_PROC_CLUSTER
from stack.local import Stack

EVERY_S = 0.1  # between samples: recovery is told to a tenth of a second


@dataclass
class OnBindings:
    """Samples the gateway's state every EVERY_S from :meth:`run` until :meth:`stop`."""

    stack: Stack
    samples: list[tuple[float, bool]] = field(default_factory=list)  # (loop time, on bindings)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    # The latest sample, taken after `_since`, found the gateway on bindings.
    _back: asyncio.Event = field(default_factory=asyncio.Event)
    _since: float = float("inf")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(timeout=2) as http:
            while not self._stop.is_set():
                at, ok = loop.time(), await self._on_bindings(http)
                self.samples.append((at, ok))
                if ok and at >= self._since:
                    self._back.set()
                else:
                    self._back.clear()
                try:
                    await asyncio.wait_for(self._stop.wait(), EVERY_S)  # the schedule
                except TimeoutError:
                    pass

    def stop(self) -> None:
        self._stop.set()

    async def _on_bindings(self, http: httpx.AsyncClient) -> bool:
        try:
            stats = await http.get(
                f"http://{self.stack.config.envoy_admin}/stats",
                params={"filter": f"^cluster\\.{EXT_PROC_CLUSTER}\\.membership_healthy$"})
            healthy = int(stats.text.rpartition(":")[2])
            if healthy < len(self.stack.config.ext_proc.addresses):
                return False
            for metrics in self.stack.ext_proc_metrics:
                gauges = _gauges((await http.get(f"http://{metrics}/metrics")).text)
                if gauges.get("kvgate_ext_proc_degraded") or gauges.get(
                        "kvgate_ext_proc_pending_writes"):
                    return False
        except (httpx.HTTPError, ValueError):  # a component restarting is not back yet
            return False
        return True

    def recovered_after(self, ended: float) -> float | None:
        """Seconds from `ended` (the fault's end, loop time) to the first sample from which the
        gateway stayed on bindings (0 if it never left them after `ended`); None if it is not
        back at the last sample."""
        back: float | None = None
        for at, ok in self.samples:
            if at < ended:
                continue
            if not ok:
                back = None
            elif back is None:
                back = at
        return None if back is None else max(0.0, back - ended)

    def off_bindings(self, ended: float) -> str:
        """When the samples found the gateway off bindings, beside the fault's end (loop time),
        for the run's log."""
        if not self.samples:
            return "no sample"
        start = self.samples[0][0]
        off = [at - start for at, ok in self.samples if not ok]
        where = (f"off bindings from {off[0]:.1f} s to {off[-1]:.1f} s into the run"
                 if off else "never off bindings")
        return (f"{where} ({len(off)} of {len(self.samples)} samples); the fault ended "
                f"{ended - start:.1f} s in")

    async def back(self, ended: float, within: float) -> None:
        """Returns once the latest sample, taken after `ended`, finds the gateway on bindings,
        or after `within` seconds if none does (the run then reports it not back). The latest,
        not any: a replica back after the fault may step aside again a moment later, and
        recovery counts from when it stayed back (`recovered_after`)."""
        self._since = ended
        if self.samples and self.samples[-1][1] and self.samples[-1][0] >= ended:
            return
        self._back.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._back.wait(), within)


def _gauges(page: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text page."""
    return {sample.name: sample.value for family in text_string_to_metric_families(page)
            for sample in family.samples if not sample.labels}
