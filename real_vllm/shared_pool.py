"""The shared pool the real-engine tier puts behind its vLLM engines: kvgate's pool service
hosted in the test's event loop (the connector profile's rules, inspectable in place), a block
directory under ``/dev/shm``, and the engine flags that attach :mod:`real_vllm.pool_connector`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from emulator.clock import EmulatedClock
from emulator.ddr_pool import DdrPool
from emulator.listen import bind_socket
from emulator.pool_faults import PoolFaults
from emulator.pool_host import PoolHost
from emulator.pool_service import make_pool_app
from emulator.transfer import TransferParams
from real_vllm.fleet import BLOCK_SIZE, EngineOptions
from real_vllm.pool_store import read_calls

REPO_ROOT = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")


@dataclass
class SharedPool:
    """A pool of ``capacity_blocks`` vLLM blocks under ``connector``'s rules; ``async with``."""

    connector: str
    capacity_blocks: int
    block_size: int = BLOCK_SIZE
    pool: DdrPool = field(init=False)
    url: str = field(init=False, default="")
    directory: Path = field(init=False)
    requests: list[dict[str, Any]] = field(init=False, default_factory=list)
    _host: PoolHost | None = field(init=False, default=None)
    _runner: web.AppRunner | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.pool = self._new_pool()
        root = SHM if SHM.is_dir() else None
        self.directory = Path(tempfile.mkdtemp(prefix="kvgate-pool-", dir=root))

    def _new_pool(self) -> DdrPool:
        return DdrPool(self.capacity_blocks * self.block_size, self.block_size, self.connector)

    def reset(self, connector: str | None = None, capacity_blocks: int | None = None) -> None:
        """An empty pool from now on, under another profile or size if given; the engines keep
        their connector (the blocks' files of the old pool are collected at the next store)."""
        self.connector = connector or self.connector
        self.capacity_blocks = capacity_blocks or self.capacity_blocks
        self.pool = self._new_pool()
        if self._host is not None:
            self._host.pool = self.pool

    @property
    def call_log(self) -> Path:
        return self.directory / "calls.jsonl"

    def served(self, path: str) -> list[dict[str, Any]]:
        """What the pool service was asked on ``path`` (``/v1/lookup``, ...) and answered, in
        order: ``{"body": ..., "reply": ...}``, whoever asked (a connector or an emulator)."""
        return [r for r in self.requests if r["path"] == path]

    def calls(self, call: str | None = None) -> list[dict[str, Any]]:
        """The connectors' calls so far, in order (only those named ``call`` if given)."""
        return [c for c in read_calls(self.call_log) if call is None or c["call"] == call]

    def engine_options(self, options: EngineOptions) -> EngineOptions:
        """``options`` with the connector attached: the same hash on every engine (sha256), the
        repository on the engine's import path."""
        config = {
            "kv_connector": "PoolConnector",
            "kv_connector_module_path": "real_vllm.pool_connector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"pool_url": self.url,
                                          "pool_dir": str(self.directory / "blocks"),
                                          "call_log": str(self.call_log)},
        }
        return replace(options,
                       extra_args=(*options.extra_args, "--prefix-caching-hash-algo", "sha256",
                                   "--kv-transfer-config", json.dumps(config)),
                       python_path=str(REPO_ROOT))

    async def start(self) -> None:
        # Real time (scale 1): a profile's leases run out in seconds, as a real store's do.
        self._host = host = PoolHost(self.pool, TransferParams(), PoolFaults(()),
                                     EmulatedClock(1.0), kv_bytes_per_token=0)
        app = make_pool_app(host)
        app.middlewares.append(self._record)
        sock = bind_socket("127.0.0.1", 0)
        self._runner = web.AppRunner(app, handle_signals=False,
                                     access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    @web.middleware
    async def _record(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        body = await request.json() if request.method == "POST" else None
        response = await handler(request)
        if body is not None and isinstance(response, web.Response) and response.text:
            self.requests.append({"path": request.path, "body": body,
                                  "reply": json.loads(response.text)})
        return response

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        shutil.rmtree(self.directory, ignore_errors=True)

    async def __aenter__(self) -> SharedPool:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
