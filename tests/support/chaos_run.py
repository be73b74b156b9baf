"""One fault run: the gateway (two ext_proc replicas, a control plane, Envoy) on a real
three-member etcd, traffic through it while a fault's schedule runs, and the account once etcd
holds every binding again (tests/support/chaos.py). A component named in ``partitioned`` reaches
etcd through one fault proxy per member (tests/support/fault_proxy.py), so the fault can cut it
off alone; "envoy" there puts a proxy between Envoy and the control plane's xDS instead."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import grpc
import httpx

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.config.model import HostPort
from stack.local import Stack, config_ports
from tests.support.chaos import Account, Traffic, account
from tests.support.etcd_cluster import EtcdCluster
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import eventually
from tests.support.recovery import OnBindings
from tests.support.stack import gateway_config, running_stack, stored_binding_values
from tests.support.upstreams import Upstream

FULL = os.environ.get("KVGATE_CHAOS") == "full"
# libfaketime's library, as the libfaketime wheel ships it: preloaded, it sets a process's wall
# clock off for every reader (Python's time.time and gRPC's C core alike), the monotonic clock
# left alone.
_FAKETIME = Path(str(resources.files("libfaketime"))) / "vendor/libfaketime/src/libfaketime.so.1"
RECOVERY_TARGET_S = 10.0  # decisions back on bindings within this long of the fault's end
RECOVERY_WAIT_S = 30.0  # how long a run waits for them before it reports "not back"
# How long traffic may take to get under way (every worker's first turn ended) before a fault's
# schedule starts: on a quiet machine milliseconds; with both cores busy ~2 s (issue 40).
UNDER_WAY_WITHIN_S = 60.0


@dataclass
class Scene:
    """What a fault acts on."""

    cluster: EtcdCluster
    stack: Stack
    proxies: dict[str, list[FaultProxy]] = field(default_factory=dict)  # component -> per member
    ended_at: float | None = None  # loop time the fault ended (its recovery counts from here)

    def ended(self) -> None:
        """The fault is over (healed, restarted, cleared): recovery is timed from now. A fault
        that does not say so ends when its schedule returns."""
        self.ended_at = asyncio.get_running_loop().time()

    def cut(self, component: str, *, reset: bool = False) -> None:
        for proxy in self.proxies[component]:
            proxy.cut(reset=reset)

    def heal(self, component: str) -> None:
        for proxy in self.proxies[component]:
            proxy.heal()


# A fault: runs its schedule under traffic; returns (its name, how many faults it made).
Fault = Callable[[Scene], Awaitable[tuple[str, int]]]


def _elected(index: int) -> bool:
    return index >= 0


async def leader_of(cluster: EtcdCluster) -> int:
    """The etcd leader's index, once the members agree on one."""
    async def leader() -> int:
        found = await cluster.leader()
        return -1 if found is None else found  # -1 while the members elect one
    return await eventually(leader, until=_elected, what="an etcd leader")


@asynccontextmanager
async def _proxied(targets: dict[str, list[str]], avoid: Collection[int]
                   ) -> AsyncIterator[dict[str, list[FaultProxy]]]:
    """`avoid`: the stack's ports, chosen free and released until it starts."""
    async with AsyncExitStack() as stack:
        yield {name: [await stack.enter_async_context(FaultProxy(t, avoid)) for t in addresses]
               for name, addresses in targets.items()}


def skewed(seconds: float) -> dict[str, str]:
    """The environment of a component whose wall clock is `seconds` off, as a host's clock
    that has drifted."""
    assert _FAKETIME.is_file(), f"libfaketime's library is not at {_FAKETIME}"
    return {"LD_PRELOAD": str(_FAKETIME), "FAKETIME": f"{seconds:+g}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


async def under_traffic(tmp_path: Path, ups: list[Upstream], prefix: str, fault: Fault,
                        partitioned: Sequence[str] = (), hot_restart: bool = False,
                        placement: dict[str, object] | None = None,
                        traffic: Callable[[str], Traffic] = Traffic,
                        failed_over: Sequence[str] = (),
                        env_for: dict[str, dict[str, str]] | None = None,
                        idle_ttl_s: float = 3600.0) -> Account:
    """``hot_restart``: Envoy runs with hot restart on (a base id of its own), so the fault can
    replace it (Stack.hot_restart_envoy). ``placement``: extra placement keys (the load gate);
    ``traffic``: the traffic for the gateway's URL; ``failed_over``: engines the fault fails
    (their sessions' bindings move, see tests.support.chaos.account); ``env_for``: environment
    one component gets (Stack.env_for; `skewed` sets its clock off); ``idle_ttl_s``: the
    sessions' idle TTL (a session idle past it by the end may have no binding, as it should)."""
    loop = asyncio.get_running_loop()
    async with EtcdCluster(tmp_path / "etcd", 3) as cluster:
        config = gateway_config([u.address for u in ups], prefix=prefix,
                                etcd=cluster.endpoints, ext_procs=2, placement=placement,
                                idle_ttl=f"{idle_ttl_s:g}s")
        targets = {name: [str(config.control_plane.xds)] if name == "envoy"
                   else cluster.endpoints for name in partitioned}
        async with _proxied(targets, config_ports(config)) as proxies, running_stack(
                config, tmp_path / "stack",
                {n: [p.address for p in ps] for n, ps in proxies.items() if n != "envoy"},
                HostPort.parse(proxies["envoy"][0].address) if "envoy" in proxies else None,
                os.getpid() % 10_000 if hot_restart else None, env_for,
        ) as stack:
            load = traffic(f"http://{stack.config.listener}")
            watch = OnBindings(stack)
            running = asyncio.create_task(load.run())
            watching = asyncio.create_task(watch.run())
            scene = Scene(cluster, stack, proxies)
            try:
                try:
                    await _under_way(load)
                    name, faults = await fault(scene)
                finally:
                    load.stop()
                    await running
                stopped = loop.time()
                ended = stopped if scene.ended_at is None else scene.ended_at
                await watch.back(ended, RECOVERY_WAIT_S)
            finally:  # the watcher stops whatever the fault did
                watch.stop()
                await watching

            async def settled() -> Account:
                # Bindings placed while etcd was away are written back once it answers again.
                read_at = time.monotonic()
                row = account(name, load.served,
                              await stored_binding_values(cluster.endpoints, prefix), faults,
                              failed_over, read_at - idle_ttl_s)
                return dataclasses.replace(row, recovery_s=watch.recovered_after(ended))

            def nothing_lost(row: Account) -> bool:
                return row.lost == 0

            try:
                return await eventually(settled, 30, until=nothing_lost, every=0.5,
                                        what="every binding in etcd")
            finally:
                last = await settled()
                print(f"\n{Account.HEADER}\n{last.row()}\nbindings complete "
                      f"{loop.time() - stopped:.1f} s after the traffic stopped; "
                      f"{watch.off_bindings(ended)}")
                print("no binding:", *last.unbound, "decisions:", *await _decisions(stack),
                      sep="\n")


async def _under_way(load: Traffic) -> None:
    """Every worker's first turn has ended: a fault's schedule ("traffic under way first")
    counts from here, whatever the machine's pace."""
    def ended() -> int:
        return len(load.served)

    await eventually(ended, UNDER_WAY_WITHIN_S, until=lambda n: n >= load.workers,
                     what=f"the first turn of each of the traffic's {load.workers} workers")


async def _decisions(stack: Stack) -> list[str]:
    """Each ext_proc replica's decisions by outcome, as its metrics count them, and what Envoy
    counts of its ext_proc streams (a failed one routes on the ring, binding nothing)."""
    found = []
    async with httpx.AsyncClient(timeout=5) as http:
        for metrics in stack.ext_proc_metrics:
            text = (await http.get(f"http://{metrics}/metrics")).text
            found += [f"{metrics} {line}" for line in text.splitlines()
                      if line.startswith("kvgate_ext_proc_decisions_total")]
        stats = await http.get(f"http://{stack.config.envoy_admin}/stats",
                               params={"filter": "ext_proc"})
        found += [line for line in stats.text.splitlines()  # counters and gauges, not zero
                  if line.rpartition(": ")[2].isdigit() and not line.endswith(": 0")]
    return found


def holds(row: Account, faults: int) -> None:
    """The targets: every fault made, enough traffic, none failed, cut, split or lost, and
    decisions back on bindings soon after the fault ended."""
    assert row.faults >= faults
    assert row.requests > 100 and row.sessions > 20, row
    assert (row.failed, row.cut, row.split, row.lost) == (0, 0, 0, 0), row
    recovered(row)


def recovered(row: Account) -> None:
    """Decisions back on bindings within RECOVERY_TARGET_S of the fault's end."""
    assert row.recovery_s is not None and row.recovery_s <= RECOVERY_TARGET_S, row


async def state_of(scene: Scene, address: str, admin: HostPort | None = None) -> str:
    """The endpoint's state as a control plane's admin API (the stack's unless `admin`)
    reports it."""
    asked = admin or scene.stack.config.control_plane.admin
    async with grpc.aio.insecure_channel(str(asked)) as channel:
        listed: pb.ListEndpointsResponse = await admin_pb2_grpc.AdminStub(channel).ListEndpoints(
            pb.ListEndpointsRequest(), timeout=10)
    return next(e.endpoint.state for e in listed.endpoints if e.endpoint.address == address)
