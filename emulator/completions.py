"""One instance's completion endpoints (``/v1/chat/completions``, ``/v1/completions``): parse,
refuse what vLLM refuses, admit into the engine model, answer (SSE or one JSON body), and give
back what a request whose client went away had not used.

A client that goes away: vLLM's OpenAI server cancels the handler when the connection closes
(``vllm/entrypoints/utils.py`` ``with_cancellation``, which waits for ``http.disconnect`` in
``listen_for_disconnect``; a streaming response stops when its client does), and the cancelled
``AsyncLLM.generate`` aborts the request in the engine (``vllm/v1/engine/async_llm.py``): it
leaves the running or waiting queue and frees its blocks. Here aiohttp cancels the handler on a
closed connection (``handler_cancellation``, set by the server) or a write fails, and the model
is told (:meth:`EngineModel.abort`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

import structlog
import xxhash
from aiohttp import web

from emulator.clock import EmulatedClock
from emulator.context_length import check_context, output_tokens
from emulator.engine_model import Admission, EngineModel
from emulator.kv_events import KvEventLog, session_id
from emulator.openai_api import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    ChunkWriter,
    CompletionRequest,
    Kind,
    error_body,
    filler,
    full_response,
    new_id,
    parse_request,
    usage,
)
from emulator.pd import PdSide, remote_decode, remote_prefill
from emulator.pool_service import PoolClient
from emulator.tokenize import Tokenizer

log = structlog.get_logger("emulator.server")


def json_error(message: str, status: int, param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, status, param), status=status)


@dataclass(slots=True)
class Completions:
    """Completions over one :class:`EngineModel`; ``engine_id`` names the instance in logs."""

    model: EngineModel
    clock: EmulatedClock
    pool: PoolClient | None
    tokenizer: Tokenizer
    _: KW_ONLY
    index: int  # in the fleet: the pool's links are per instance
    seed: int
    max_model_len: int
    kv_events: KvEventLog | None  # the cache's observer, told each request's tokens
    engine_id: Callable[[], str]
    # the two-stage wire (kv_transfer_params); None: the params are ignored
    pd: PdSide | None = None

    async def complete(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        try:
            body: Any = json.loads(await request.read())
        except ValueError:
            return json_error("request body is not valid JSON", 400)
        try:
            req = parse_request(body, kind, self.model.config.model)
        except ApiError as exc:
            return json_error(exc.message, exc.status, exc.param)
        if req.prompt_ids is not None:
            tokens = req.prompt_ids
            key = hash(tuple(tokens))
        else:
            assert req.prompt_text is not None
            tokens = self.tokenizer.encode(req.prompt_text)
            key = xxhash.xxh3_64_intdigest(req.prompt_text.encode())
        if not tokens:
            return json_error("the prompt is empty", 400, "prompt")
        try:
            check_context(len(tokens), req.max_tokens, self.max_model_len)
        except ApiError as exc:
            return json_error(exc.message, exc.status, exc.param)
        wanted = output_tokens(len(tokens), req.max_tokens, DEFAULT_MAX_TOKENS,
                               self.max_model_len)
        pieces = filler(self.seed, key, wanted)
        session = session_id(body, request.headers) if self.kv_events is not None else None
        params = body.get("kv_transfer_params") if self.pd is not None else None
        admission = await self._admit(tokens, wanted, pieces, session, params)
        whole = False
        try:
            if req.stream:
                response, whole = await self._stream(request, req, admission, pieces)
                return response
            await self._prefilled(admission)
            await self.clock.sleep_until(admission.slot.finish)
            body_out = full_response(req, new_id(kind), "".join(pieces), self._usage(admission))
            if self.pd is not None and remote_decode(params):
                body_out["kv_transfer_params"] = self.pd.prefill_answer(admission.to_pool)
            whole = True
            return web.json_response(body_out)
        finally:
            await self._finished(admission, whole)

    async def _admit(self, tokens: list[int], max_tokens: int, pieces: list[str],
                     session: str | None = None, params: Any = None) -> Admission:
        arrived = self.clock.now()
        probe = self.model.probe(arrived, tokens)
        ddr: int | None = None
        remote = self.pd is not None and remote_prefill(params)
        if remote:  # the connector that pulls from the prefill engine is the only loader
            assert self.pd is not None
            ddr = await self.pd.pull(params, probe.limit_blocks - probe.hbm_blocks,
                                     self.model.config.block_size, self.engine_id())
        elif self.pool is not None:
            try:
                # Returns once the blocks found are in this instance's HBM (the pool's links).
                ddr = await self.pool.load(probe.pool_hashes, self.index, probe.hbm_blocks)
            except Exception as exc:  # an unreachable pool is a miss, as with a real connector
                log.warning("pool_lookup_failed", engine_id=self.engine_id(), error=str(exc))
                ddr = 0
        output = self.tokenizer.encode("".join(pieces))
        answer = self.model.output_hashes(tokens, probe, output)
        if self.kv_events is not None:  # the blocks it caches now carry these tokens
            self.kv_events.expect(tokens, output, len(probe.hashes), session)
        # The transfer was timed by the pool; TTFT counts from the arrival.
        return self.model.admit(self.clock.now(), probe, max_tokens, ddr, answer,
                                arrival=arrived if self.pool is not None or remote else None)

    async def _prefilled(self, admission: Admission) -> None:
        """Wait for the first token, then offer the prompt's blocks to the pool (its connector
        profile decides what it writes)."""
        await self.clock.sleep_until(admission.slot.first_token)
        if self.pool is not None and admission.to_pool:
            try:
                await self.pool.store(admission.to_pool, admission.hbm_blocks,
                                      admission.ddr_blocks)
            except Exception as exc:
                log.warning("pool_insert_failed", engine_id=self.engine_id(), error=str(exc))

    async def _finished(self, admission: Admission, whole: bool) -> None:
        """The request is over (``whole``: its answer was sent to its end) or its client went
        away: the model frees what it held, the pool hears of it (decode blocks,
        end-of-request refresh)."""
        if whole:
            self.model.finish(admission)
        else:
            self.model.abort(admission, self.clock.now())
            log.info("request_aborted", engine_id=self.engine_id(), reason="client gone")
        if self.pool is not None:
            try:
                await self.pool.finish(admission.to_pool, admission.answer, admission.hbm_blocks,
                                       admission.ddr_blocks)
            except Exception as exc:
                log.warning("pool_finish_failed", engine_id=self.engine_id(), error=str(exc))

    @staticmethod
    def _usage(admission: Admission) -> dict[str, Any]:
        return usage(admission.prompt_tokens, admission.output_tokens, admission.cached_tokens)

    async def _stream(self, request: web.Request, req: CompletionRequest,
                      admission: Admission, pieces: list[str],
                      ) -> tuple[web.StreamResponse, bool]:
        """The answer as SSE, and whether it reached its end (False: the client went away)."""
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        writer = ChunkWriter(req, new_id(req.kind))
        slot = admission.slot
        step = self.model.token_interval(slot, len(pieces))
        n = len(pieces)
        try:
            await self._prefilled(admission)
            await resp.write(writer.role() + writer.token(pieces[0], n == 1))
            i = 1
            while i < n:
                due = slot.first_token + i * step
                now = self.clock.now()
                if due > now and self.clock.time_scale > 0:
                    await self.clock.sleep_until(due)
                    now = max(now, due)
                # Emit every token that is due in one write; with time scale 0, all of them.
                end = i + 1
                if self.clock.time_scale <= 0:
                    end = n
                else:
                    while end < n and slot.first_token + end * step <= now:
                        end += 1
                await resp.write(b"".join(
                    writer.token(pieces[k], k == n - 1) for k in range(i, end)
                ))  # fmt: skip
                i = end
            tail = writer.usage(self._usage(admission)) if req.include_usage else b""
            await resp.write(tail + writer.done())
            await resp.write_eof()
        except ConnectionResetError:
            return resp, False  # the client went away between two writes
        return resp, True
