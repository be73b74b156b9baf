"""Several engine instances and (optionally) the shared DDR pool, in one process.

Usage::

    async with Fleet(EmulatorOptions(instances=2, time_scale=0)) as fleet:
        fleet.engines   # ["127.0.0.1:40123", "127.0.0.1:40125"]
        fleet.pool_url  # "http://127.0.0.1:40127", or None without a pool
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from types import TracebackType
from typing import Self

import structlog
from aiohttp import web

from emulator.clock import EmulatedClock
from emulator.ddr_pool import DdrPool
from emulator.engine_model import EngineModel
from emulator.kv_events import KvEventLog
from emulator.kv_events_zmq import KvEventPublisher
from emulator.listen import bind_socket
from emulator.options import EmulatorOptions
from emulator.pd import Link
from emulator.pool_faults import PoolFaults
from emulator.pool_host import PoolHost
from emulator.pool_service import HttpPoolClient, LocalPoolClient, PoolClient, make_pool_app
from emulator.server import EngineServer
from kvgate.contract.states import Role

log = structlog.get_logger("emulator.fleet")


class Fleet:
    """An emulated fleet; ``await start()`` binds everything, ``await stop()`` releases it."""

    def __init__(self, options: EmulatorOptions, fleet_ports: Collection[int] = ()) -> None:
        """`fleet_ports`: the ports every instance of the whole fleet will take, in this
        process or others (`--processes`), which the pool's free port must not be."""
        options.validate()
        self.options = options
        self._fleet_ports = {*fleet_ports, *options.instance_ports()}
        self.clock = EmulatedClock(options.time_scale)
        self.servers: list[EngineServer] = []
        self.pool: DdrPool | None = None  # the pool model, when this process hosts it
        self.pool_host: PoolHost | None = None  # with its links and faults
        self.pool_url: str | None = None
        self._pool_client: PoolClient | None = None
        self._pool_runner: web.AppRunner | None = None
        self.publishers: list[KvEventPublisher] = []  # KV events, one per instance when asked

    @property
    def engines(self) -> list[str]:
        """``host:port`` of every instance, in order."""
        return [server.address for server in self.servers]

    async def start(self) -> None:
        """Start the pool (unless disabled or joined) and every instance."""
        try:
            await self._start_pool()
            await self._start_engines()
        except BaseException:
            await self.stop()
            raise

    async def _start_pool(self) -> None:
        opts = self.options
        if opts.no_ddr_pool:
            return
        if opts.pool_url:
            self.pool_url = opts.pool_url.rstrip("/")
            self._pool_client = HttpPoolClient(self.pool_url)
            return
        self.pool = DdrPool(opts.pool_tokens, opts.block_size, opts.pool_connector,
                            opts.pool_high_watermark, opts.pool_low_watermark)
        self.pool_host = PoolHost(self.pool, opts.transfer_params(), PoolFaults(opts.pool_windows),
                                  self.clock, opts.kv_bytes_per_token)
        # Instances here use the model directly; the HTTP service is for other processes.
        self._pool_client = LocalPoolClient(self.pool_host)
        sock = self._pool_socket()
        port = sock.getsockname()[1]
        self._pool_runner = web.AppRunner(
            make_pool_app(self.pool_host), handle_signals=False, access_log=None,
            shutdown_timeout=1.0,
        )
        await self._pool_runner.setup()
        await web.SockSite(self._pool_runner, sock).start()
        host = f"[{opts.host}]" if ":" in opts.host else opts.host
        self.pool_url = f"http://{host}:{port}"
        log.info("pool_listening", url=self.pool_url, capacity_blocks=self.pool.capacity_blocks)

    def _pool_socket(self) -> socket.socket:
        """The pool's socket; on a free port, never one an instance is about to take (the
        kernel may hand out a port a caller chose for an instance and released)."""
        opts = self.options
        taken: list[socket.socket] = []  # held until a good one is found, so none comes back
        try:
            while True:
                sock = bind_socket(opts.host, opts.pool_port)
                if opts.pool_port or sock.getsockname()[1] not in self._fleet_ports:
                    return sock
                taken.append(sock)
        finally:
            for sock in taken:
                sock.close()

    async def _start_engines(self) -> None:
        opts = self.options
        config = opts.engine_config()
        for i in range(opts.instances):
            index = opts.first_index + i  # its place in the whole fleet (emulator.processes)
            model = EngineModel(config)
            events = await self._start_kv_events(model, i) if opts.kv_events_port else None
            role = opts.role(i)
            server = EngineServer(
                model,
                self.clock,
                # A decode engine neither reads nor writes the pool: under vLLM-Ascend's
                # MultiConnector[MooncakeConnectorV1, AscendStoreConnector] the transfer
                # connector is the decode side's only loader and the pool's consumer_is_to_load
                # and consumer_is_to_put are off (docs/.../kv_pool.md 2.3.1).
                None if role is Role.DECODE else self._pool_client,
                host=opts.host,
                port=opts.ports[i] if opts.ports else (opts.port + i if opts.port else 0),
                engine_id_template=opts.engine_id,
                index=index,
                seed=opts.seed + index,
                max_model_len=opts.max_model_len,
                kv_events=events,
                role=role,
                link=Link(opts.ddr_gbps, opts.transfer_fixed_ms, opts.kv_bytes_per_token),
            )
            self.servers.append(server)
            await server.start()

    async def _start_kv_events(self, model: EngineModel, i: int) -> KvEventLog:
        """Instance ``i``'s KV event log, its cache's observer, published on the ports given."""
        opts = self.options
        events = KvEventLog(opts.block_size)
        model.cache.observer = events
        publisher = KvEventPublisher(
            events, opts.host, opts.kv_events_port + i, topic=opts.kv_events_topic,
            replay_port=opts.kv_events_replay_port + i if opts.kv_events_replay_port else None,
            step_s=opts.decode_ms_per_token / 1000.0 * opts.time_scale)
        self.publishers.append(publisher)
        await publisher.start()
        return events

    async def stop(self) -> None:
        """Stop every instance, then the pool. Safe to call twice."""
        for server in self.servers:
            await server.stop()
        for publisher in self.publishers:
            await publisher.close()
        self.publishers.clear()
        if self._pool_runner is not None:
            await self._pool_runner.cleanup()
            self._pool_runner = None
        if self._pool_client is not None:
            await self._pool_client.close()
            self._pool_client = None
        if self.pool_host is not None:
            self.pool_host.close()

    def server(self, engine: str) -> EngineServer:
        """The instance listening on ``engine`` (``host:port``)."""
        for server in self.servers:
            if server.address == engine:
                return server
        raise KeyError(engine)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
