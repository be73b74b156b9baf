"""The probe set that follows discovered engines: the health checks probe the file's engines and
the discovered ones etcd's records hold (with_discovered), and are reconfigured only when that
set changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from control_plane.discovery.service import Discovery, with_discovered
from kvgate.config import Config
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd.observed import MirrorMetrics

ProbeSet = frozenset[tuple[str, str]]  # (pool, endpoint) pairs


def probe_set(config: Config) -> ProbeSet:
    return frozenset((p.name, e.key) for p in config.pools for e in p.endpoints)


class DiscoveredProbes:
    """Runs a config's discovery and keeps the health checks (`reconfigure`) on the engines it
    serves."""

    def __init__(self, discovery: Discovery, directory: EndpointDirectory,
                 reconfigure: Callable[[Config], Awaitable[None]],
                 mirrors: MirrorMetrics) -> None:
        self._discovery = discovery
        self._directory = directory
        self._reconfigure = reconfigure
        self._mirrors = mirrors
        self._probed: ProbeSet = frozenset()  # the engines the health checks probe

    def serving(self, config: Config) -> Config:
        """The file's config with the discovered engines etcd's records hold."""
        return with_discovered(config, self._directory)

    def configure(self, config: Config) -> None:
        """At start, before the checker starts on `config`'s own engines."""
        self._discovery.configure(config)
        self._probed = probe_set(config)  # what the checker starts with
        if self._discovery.mirror is not None and any(
                p.discover is not None and p.discover.etcd is not None for p in config.pools):
            self._mirrors.track(self._discovery.mirror)

    async def follow(self, config: Config) -> None:
        """Health checks follow the discovered engines as they come and go."""
        serving = self.serving(config)
        probed = probe_set(serving)
        if probed != self._probed:
            self._probed = probed
            await self._reconfigure(serving)

    async def reload(self, config: Config) -> None:
        """A reloaded config: its discovery restarted, the checker moved to what it serves."""
        self._discovery.configure(config)
        await self._discovery.start()
        serving = self.serving(config)  # the file's engines and the discovered ones, read once
        self._probed = probe_set(serving)
        await self._reconfigure(serving)
