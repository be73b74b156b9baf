"""Small workloads and traces the bench/simulator tests share."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from workload.bank import BankCodingOptions, bank_coding
from workload.model import Workload


def small_bank(sessions: int = 12, duration_s: float = 240.0, seed: int = 0,
               context: int = 3000) -> Workload:
    workload = bank_coding(BankCodingOptions(
        sessions=sessions, duration_s=duration_s, ramp_s=60.0, seed=seed,
        context_median_tokens=context, context_min_tokens=1000, context_max_tokens=8000,
        think_median_s=20.0, answer_median_tokens=60, answer_max_tokens=200,
    ))
    workload.warmup_s = 0.0
    return workload


def write_trace(path: Path, conversations: int = 8, turns: int = 3, seed: int = 0) -> Path:
    """A Mooncake-format trace: each conversation re-sends its history plus new blocks."""
    rng = random.Random(seed)
    next_id = 1
    records: list[dict[str, Any]] = []  # JSON lines
    for c in range(conversations):
        ids = [0]  # shared system prompt block
        t = c * 2000
        for _ in range(turns):
            for _ in range(rng.randint(1, 3)):
                ids.append(next_id)
                next_id += 1
            length = 512 * (len(ids) - 1) + rng.randint(1, 512)
            records.append({"timestamp": t, "input_length": length,
                            "output_length": rng.randint(5, 50), "hash_ids": list(ids)})
            t += rng.randint(5000, 20000)
    records.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@asynccontextmanager
async def gateway_answering(
    complete: Callable[[web.Request], Awaitable[web.StreamResponse]],
    api_key: str | None = None,
) -> AsyncIterator[str]:
    """A stand-in gateway listing model "m" and answering completions with ``complete``; with
    ``api_key``, every path answers 401 to a request without ``Authorization: Bearer <key>``."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    @web.middleware
    async def key_check(request: web.Request, handler: Callable[[web.Request], Awaitable[
            web.StreamResponse]]) -> web.StreamResponse:
        if request.headers.get("authorization") != f"Bearer {api_key}":
            return web.json_response({"error": {"message": "invalid API key"}}, status=401)
        return await handler(request)

    app = web.Application(middlewares=[key_check] if api_key is not None else [])
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def streamed_answer(request: web.Request) -> web.StreamResponse:
    """A one-token streamed completion with usage, as the bench expects."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    for chunk in ({"choices": [{"index": 0, "text": "x"}]}, {"choices": [], "usage": usage}):
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response
