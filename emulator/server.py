"""One emulated engine instance: vLLM's HTTP surface over an :class:`EngineModel`.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE or not), ``GET /v1/models``,
``POST /tokenize``, ``POST /detokenize``, ``GET /health``, ``GET /metrics``,
``POST /reset_prefix_cache`` (vLLM's dev-mode endpoint), ``POST /kv_transfer/pull`` (a decode
engine reads the blocks this one prefilled for it: emulator.pd); admin:
``POST|GET /admin/fault``, ``GET /admin/last-request-headers``, ``GET /admin/stats``. Every
response carries ``x-engine-id``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from emulator.clock import EmulatedClock
from emulator.completions import Completions, json_error
from emulator.engine_model import EngineModel
from emulator.kv_events import KvEventLog
from emulator.listen import bind_socket
from emulator.metrics import CONTENT_TYPE, make_registry, page, stats_body
from emulator.openai_api import ApiError, Kind, models_body
from emulator.options import DEFAULT_MAX_MODEL_LEN
from emulator.pd import PULL_PATH, Link, PdSide
from emulator.pool_service import PoolClient
from emulator.tokenize import Tokenizer
from emulator.tokenize_api import detokenize, tokenize
from kvgate.contract.states import Role

FAULT_MODES = ("none", "unhealthy", "error503", "refuse")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = structlog.get_logger("emulator.server")


class EngineServer:
    """Serves one instance on ``host:port``; ``engine_id`` names it in ``x-engine-id``."""

    def __init__(
        self,
        model: EngineModel,
        clock: EmulatedClock,
        pool: PoolClient | None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        engine_id_template: str = "{host}:{port}",
        index: int = 0,
        seed: int = 0,
        tokenizer: Tokenizer | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        kv_events: KvEventLog | None = None,
        role: Role = Role.BOTH,
        link: Link | None = None,
    ) -> None:
        self.model = model
        self.pd = PdSide(role, model, clock, link or Link())
        self.clock = clock
        self.host = host
        self.port = port
        self.index = index
        self.engine_id = ""
        self._template = engine_id_template
        self.fault = "none"
        self._fault_timer: asyncio.TimerHandle | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        self._registry = make_registry(model, clock.now)
        self._last_headers: dict[str, str] = {}
        self._last_path = ""
        self._created = int(time.time())
        self.completions = Completions(
            model, clock, pool, tokenizer or Tokenizer(), index=index, seed=seed,
            max_model_len=max_model_len, kv_events=kv_events, engine_id=lambda: self.engine_id,
            pd=self.pd)

    @property
    def address(self) -> str:
        """``host:port`` the instance listens on."""
        return f"{self.host}:{self.port}"

    def make_app(self) -> web.Application:
        """The aiohttp application (routes, middlewares, the x-engine-id signal)."""
        app = web.Application(
            middlewares=[self._middleware],
            client_max_size=256 * 1024 * 1024,
            # Long session ids (8 KiB) and big headers must reach the engine as they do vLLM's.
            handler_args={"max_field_size": 65536, "max_line_size": 65536},
        )
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/", self._metrics)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_post(PULL_PATH, self._kv_pull)
        app.router.add_post("/admin/fault", self._set_fault)
        app.router.add_get("/admin/fault", self._get_fault)
        app.router.add_get("/admin/last-request-headers", self._last_request_headers)
        app.router.add_get("/admin/stats", self._stats)
        app.on_response_prepare.append(self._tag_response)
        return app

    async def start(self) -> None:
        """Bind and listen; afterwards :attr:`port` and :attr:`engine_id` are final."""
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.engine_id = self._template.format(host=self.host, port=self.port, index=self.index)
        self.pd.engine_id, self.pd.host, self.pd.port = self.engine_id, self.host, self.port
        # In-flight emulated requests may sleep for minutes: stopping cancels them after 1 s
        # instead of aiohttp's default 60 s grace.
        # handler_cancellation: a request whose client goes away is cancelled and aborted, as
        # vLLM's server does (emulator.completions).
        self._runner = web.AppRunner(
            self.make_app(), handle_signals=False, access_log=None, shutdown_timeout=1.0,
            handler_cancellation=True,
        )
        await self._runner.setup()
        await self._listen(sock)
        log.info("engine_listening", engine_id=self.engine_id, address=self.address)

    async def _listen(self, sock: socket.socket | None = None) -> None:
        assert self._runner is not None
        self._site = web.SockSite(self._runner, sock or bind_socket(self.host, self.port))
        await self._site.start()

    async def stop(self) -> None:
        """Stop listening and close connections."""
        if self._fault_timer is not None:
            self._fault_timer.cancel()
            self._fault_timer = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None
        await self.pd.close()

    # ---- fault injection -------------------------------------------------------------------

    async def set_fault(self, mode: str, for_s: float | None = None) -> None:
        """Switch fault mode; with ``for_s``, revert to ``none`` after that many wall seconds."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {', '.join(FAULT_MODES)}")
        if self._fault_timer is not None:
            self._fault_timer.cancel()
            self._fault_timer = None
        previous, self.fault = self.fault, mode
        if mode == "refuse" and self._site is not None:
            # Closing the listener refuses new connections; open ones are aborted by the
            # middleware on their next request.
            await self._site.stop()
            self._site = None
        elif previous == "refuse" and mode != "refuse" and self._site is None:
            await self._listen()
        if for_s is not None:
            loop = asyncio.get_running_loop()
            self._fault_timer = loop.call_later(for_s, self._revert_fault)
        log.info("fault_set", engine_id=self.engine_id, mode=mode, for_s=for_s)

    def _revert_fault(self) -> None:
        self._fault_timer = None
        task = asyncio.get_running_loop().create_task(self.set_fault("none"))
        task.add_done_callback(self._log_task_error)

    def _log_task_error(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("fault_revert_failed", engine_id=self.engine_id, error=str(task.exception()))

    async def _set_fault(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return json_error("body is not valid JSON", 400)
        mode = body.get("mode") if isinstance(body, dict) else None
        for_s = body.get("for_s") if isinstance(body, dict) else None
        if mode not in FAULT_MODES:
            return json_error(f"'mode' must be one of {', '.join(FAULT_MODES)}", 400, "mode")
        if for_s is not None and (
            isinstance(for_s, bool) or not isinstance(for_s, int | float) or for_s < 0
        ):
            return json_error("'for_s' must be a non-negative number", 400, "for_s")
        await self.set_fault(mode, for_s)
        # Connection: close so the caller's pooled connection is not reused into a refusal.
        return web.json_response({"mode": mode, "for_s": for_s}, headers={"Connection": "close"})

    async def _get_fault(self, request: web.Request) -> web.Response:
        return web.json_response({"mode": self.fault})

    # ---- plumbing --------------------------------------------------------------------------

    async def _tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-engine-id"] = self.engine_id

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.fault == "refuse" and request.path != "/admin/fault":
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        if request.path.startswith("/v1/"):  # inference only: probes and scrapes would overwrite it
            self._last_headers = {k.lower(): v for k, v in request.headers.items()}
            self._last_path = request.path
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return json_error(exc.reason, exc.status)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("handler_failed", engine_id=self.engine_id, path=request.path)
            return json_error(f"internal error: {type(exc).__name__}", 500)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(models_body(self.model.config.model, self._created))

    async def _tokenize(self, request: web.Request) -> web.Response:
        return await self._tokenizer_call(request, lambda body: tokenize(
            body, self.model.config.model, self.completions.tokenizer,
            self.completions.max_model_len))

    async def _detokenize(self, request: web.Request) -> web.Response:
        return await self._tokenizer_call(request, lambda body: detokenize(
            body, self.model.config.model, self.completions.tokenizer))

    async def _tokenizer_call(self, request: web.Request,
                              answer: Callable[[Any], dict[str, Any]]) -> web.Response:
        try:
            body: Any = json.loads(await request.read())
        except ValueError:
            return json_error("request body is not valid JSON", 400)
        try:
            return web.json_response(answer(body))
        except ApiError as exc:
            return json_error(exc.message, exc.status, exc.param)

    async def _health(self, request: web.Request) -> web.Response:
        if self.fault == "unhealthy":
            return web.Response(status=503, text="unhealthy")
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = page(self._registry, request.path, request.query.getall("name[]", []))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        """Empty the HBM cache, as vLLM does, unless a running request holds blocks."""
        self.model.usage(self.clock.now())  # unpin what has finished by now
        return web.json_response({"success": self.model.cache.reset()})

    async def _last_request_headers(self, request: web.Request) -> web.Response:
        return web.json_response({"path": self._last_path, "headers": self._last_headers})

    async def _stats(self, request: web.Request) -> web.Response:
        body = stats_body(self.model, self.clock.now())
        pd = self.pd
        return web.json_response({
            "engine_id": self.engine_id, **body, "fault": self.fault, "role": pd.role,
            "kv_transfer": {"held": len(pd.handoffs), "pulled": pd.handoffs.pulled,
                            "expired": pd.handoffs.expired, "pulled_tokens": pd.pulled_tokens,
                            "failed_pulls": pd.failed_pulls}})

    async def _kv_pull(self, request: web.Request) -> web.Response:
        """A decode engine reads the blocks of one of this engine's prefills (emulator.pd)."""
        try:
            rid = str((await request.json())["remote_request_id"])
        except (ValueError, KeyError, TypeError):
            return json_error("expected {remote_request_id}", 400)
        blocks = self.pd.handoffs.pull(rid)
        if blocks is None:
            return json_error(f"no blocks held for {rid} (pulled, expired or unknown)", 404)
        return web.json_response({"blocks": blocks})

    # ---- completions -----------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completion")

    async def _complete(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        if self.fault == "error503":
            return json_error("engine unavailable (injected fault)", 503)
        return await self.completions.complete(request, kind)
