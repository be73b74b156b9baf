"""Drives an OpenAI-compatible endpoint with a workload, streaming `/v1/completions`, the session
id where `session_in` says: a header, the body's `prompt_cache_key`, or nowhere (the gateway's
implicit sessions). A request with a fixed arrival is sent at that time x the time scale (open
loop); a later turn of a session is sent once the previous turn's answer is complete, after the
user's think time (closed loop, as a developer waits for the answer the next prompt contains), and
its prompt resends the answer the engine gave (so an engine that cached it finds it), not the
workload's stand-in text.

Per request: TTFT (send to first streamed token, in emulated seconds = wall / time scale), output
tokens, `usage.prompt_tokens_details.cached_tokens`, errors, and the engine that served it: from
the gateway's opt-in upstream header (`upstream_header:`, `x-kvgate-upstream`), or the emulator's
`x-engine-id`; with neither, from each engine's `vllm:request_success_total` over the run (needs
the engines' URLs), which works in front of any vLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from bench.engine_metrics import CacheCounters, scrape, scrape_each
from benchkit.report import ModeStats
from workload.model import Request, Workload
from workload.text import TextMaker

if TYPE_CHECKING:  # only with the bench extra, imported when a progress bar is wanted
    from tqdm import tqdm


@dataclass(frozen=True, slots=True)
class DriveOptions:
    url: str  # gateway base URL, e.g. http://127.0.0.1:8080
    time_scale: float = 1.0  # wall seconds per emulated second (the engines' --time-scale)
    header: str = "x-session-id"  # the session header (session_in "header")
    model: str | None = None  # None: the first of GET /v1/models
    engines: Sequence[str] = ()  # engine base URLs whose /metrics to read
    timeout_s: float = 600.0  # wall seconds per request
    progress: bool = False
    label: str = "bench"
    session_in: str = "header"  # "header", "body" (prompt_cache_key) or "none"
    extra_headers: tuple[tuple[str, str], ...] = ()  # sent with every request
    # Response headers naming the serving engine, first present wins.
    engine_headers: tuple[str, ...] = ("x-kvgate-upstream", "x-engine-id")
    # A client routing by itself (no gateway): session -> the base URL its request goes to,
    # asked once per request (real_vllm.direct). None: every request to ``url``.
    route: Callable[[str], str] | None = None



SESSION_IN = ("header", "body", "none")
BODY_SESSION_FIELD = "prompt_cache_key"  # OpenAI's own field for cache routing


def request_parts(o: DriveOptions, session: str, body: dict[str, object]
                  ) -> tuple[dict[str, str], dict[str, object]]:
    """The headers and body of one request, the session put where ``o.session_in`` says."""
    headers = dict(o.extra_headers)
    if o.session_in == "header":
        headers[o.header] = session
    elif o.session_in == "body":
        body = {**body, BODY_SESSION_FIELD: session}
    return headers, body



@dataclass(frozen=True, slots=True)
class RequestSample:
    """One measured request, for fitting engine timing (wall seconds / time scale)."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    output_tokens: int
    decode_s: float  # first streamed token to the last

    @property
    def uncached(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(slots=True)
class DriveResult:
    stats: ModeStats
    engines: dict[str, int] = field(default_factory=dict)  # engine address -> requests
    endpoints: list[str] = field(default_factory=list)  # the fleet's addresses, when known
    counters: CacheCounters | None = None  # /metrics delta over the measured part
    late_s: float = 0.0  # worst lateness of a send behind its schedule (wall)
    output_tokens: int = 0
    samples: list[RequestSample] = field(default_factory=list)  # measured requests, in order


class GatewayUnreachable(Exception):
    """The gateway did not answer ``GET /v1/models`` before the run: nothing was sent."""


def redact_url(url: str) -> str:
    """``url`` without the password of its user part (``http://user:***@host``), for messages and
    records."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


async def _first_model(http: aiohttp.ClientSession, o: DriveOptions) -> str:
    """The gateway's first model; also proves the gateway answers (with the extra headers, which
    may be its API key) before any timing starts."""
    shown = redact_url(o.url)
    try:
        async with http.get(f"{o.url}/v1/models", headers=dict(o.extra_headers),
                            timeout=aiohttp.ClientTimeout(total=30)) as r:
            r.raise_for_status()
            return str((await r.json())["data"][0]["id"])
    except aiohttp.ClientResponseError as exc:
        raise GatewayUnreachable(f"{shown}/v1/models answered HTTP {exc.status}") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        password = urlsplit(o.url).password
        if password:  # the exception's text may hold the URL
            reason = reason.replace(password, "***")
        raise GatewayUnreachable(f"{shown}/v1/models: {reason}") from None
    except (KeyError, IndexError, TypeError, ValueError):
        raise GatewayUnreachable(f"{shown}/v1/models did not list a model") from None


async def _one(http: aiohttp.ClientSession, o: DriveOptions, model: str, request: Request,
               prompt: str, measured: bool, result: DriveResult, sent_event: asyncio.Event,
               origin: float) -> str | None:
    """Send one request; its answer's text, or None if it failed."""
    headers, body = request_parts(o, request.session, {
        "model": model, "prompt": prompt, "max_tokens": request.max_tokens, "stream": True,
        "stream_options": {"include_usage": True}})
    scale = o.time_scale or 1.0
    base = o.url if o.route is None else o.route(request.session)
    sent = time.perf_counter()
    arrival = (sent - origin) / scale
    try:
        async with http.post(f"{base}/v1/completions", json=body,
                             headers=headers) as response:
            sent_event.set()  # the engine has the request (and counted it in /metrics)
            engine = next((response.headers[h] for h in o.engine_headers
                           if h in response.headers), None if o.route is None else base)
            if response.status != 200:
                await response.read()
                raise aiohttp.ClientResponseError(response.request_info, (),
                                                  status=response.status)
            stream = await _read_stream(response)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        if measured:
            result.stats.error(arrival)
        return None
    finally:
        sent_event.set()
    done = time.perf_counter()
    first, usage = stream.first, stream.usage
    if first is None or usage is None:
        if measured:
            result.stats.error(arrival)
        return None
    if engine is not None:
        result.engines[engine] = result.engines.get(engine, 0) + 1
    result.output_tokens += stream.tokens
    if measured:
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
        result.stats.add(arrival, (first - sent) / scale, arrival + (done - sent) / scale,
                         int(usage["prompt_tokens"]), cached)
        result.samples.append(RequestSample(
            int(usage["prompt_tokens"]), cached,
            (first - sent) / scale, stream.tokens, (stream.last - first) / scale))
    return "".join(stream.text)


@dataclass(slots=True)
class _Stream:
    """What a streamed completion brought: its chunks' text, when the first and the last came
    (perf_counter), and the usage the server reported (None: it did not)."""

    tokens: int = 0
    text: list[str] = field(default_factory=list)
    first: float | None = None
    last: float = 0.0
    usage: dict[str, Any] | None = None  # parsed JSON


async def _read_stream(response: aiohttp.ClientResponse) -> _Stream:
    """Read an SSE completion to its ``[DONE]`` (ValueError: a chunk is not JSON)."""
    stream = _Stream()
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        payload = line[6:].strip()
        if payload == b"[DONE]":
            break
        chunk = json.loads(payload)
        if choices := chunk.get("choices"):
            stream.tokens += 1
            stream.text.append(str(choices[0].get("text") or ""))
            stream.last = time.perf_counter()
            if stream.first is None:
                stream.first = stream.last
        if chunk.get("usage"):
            stream.usage = chunk["usage"]
    return stream


async def drive(workload: Workload, o: DriveOptions) -> DriveResult:
    """Send the whole workload; returns when every request has finished or failed."""
    result = DriveResult(ModeStats())
    texts = TextMaker()
    requests = workload.requests
    last = {id(r.chain): i for i, r in enumerate(requests)}
    following = workload.next_turns()
    connector = aiohttp.TCPConnector(limit=2000, force_close=False)
    timeout = aiohttp.ClientTimeout(total=o.timeout_s)
    bar = _progress(o, len(requests))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        found = await _first_model(http, o)
        model = o.model or found
        # Per-engine counters over the whole run: attribution when no header names engines.
        at_start = await scrape_each(http, o.engines) if o.engines else None
        start = time.perf_counter()
        warmup_sent: list[asyncio.Event] = []
        # The fleet's counters before the first measured request (every sender waits for it).
        before: asyncio.Task[CacheCounters | None] | None = None

        async def send(i: int, answer: str | None = None) -> str | None:
            nonlocal before
            request = requests[i]
            measured = workload.measured(request)
            if measured:
                if before is None:
                    before = asyncio.create_task(_counters_after(http, o.engines, warmup_sent))
                await before
            prompt = texts.prompt(request, answer)
            if last[id(request.chain)] == i:
                texts.forget(request)
            sent_event = asyncio.Event()
            if not measured:
                warmup_sent.append(sent_event)
            got = await _one(http, o, model, request, prompt, measured, result, sent_event,
                             start)
            if bar is not None:
                bar.update(1)
            return got

        async def session(i: int) -> None:
            answer = await send(i)
            while (i := following[i]) >= 0:
                await asyncio.sleep((requests[i].think_s or 0.0) * o.time_scale)
                answer = await send(i, answer)  # the next prompt resends the answer it got

        await _open_sessions(requests, o.time_scale, start, result, session)
        counted = None if before is None else before.result()
        if counted is not None:
            after = await scrape(http, o.engines)
            result.counters = None if after is None else after - counted
        if not result.engines and at_start is not None:
            result.engines = await _served_per_engine(http, o.engines, at_start)
    if bar is not None:
        bar.close()
    _split(result)
    return result


def _progress(o: DriveOptions, total: int) -> tqdm[NoReturn] | None:
    if not o.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=o.label, unit="req", mininterval=0.5, leave=False)


async def _open_sessions(requests: Sequence[Request], time_scale: float, start: float,
                         result: DriveResult,
                         session: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """Start each session at its first request's arrival (counting how late the sender fell
    behind); returns once every session has ended."""
    tasks: set[asyncio.Task[None]] = set()
    for i, request in enumerate(requests):
        if request.think_s is not None:
            continue  # sent by its session after the previous answer
        delay = start + request.arrival * time_scale - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            result.late_s = max(result.late_s, -delay)
        task = asyncio.create_task(session(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))


async def _counters_after(http: aiohttp.ClientSession, engines: Sequence[str],
                          warmup_sent: list[asyncio.Event]) -> CacheCounters | None:
    """The fleet's counters once every warm-up request has reached its engine (bounded wait)."""
    if not engines:
        return None
    pending = [e.wait() for e in warmup_sent if not e.is_set()]
    if pending:
        try:
            await asyncio.wait_for(asyncio.gather(*pending), timeout=10.0)
        except TimeoutError:
            pass
    return await scrape(http, engines)


async def _served_per_engine(http: aiohttp.ClientSession, engines: Sequence[str],
                             before: dict[str, CacheCounters]) -> dict[str, int]:
    """Requests each engine finished since ``before`` (engines that served none left out)."""
    after = await scrape_each(http, engines)
    if after is None:
        return {}
    served = {url.split("://", 1)[-1].rstrip("/"): round((after[url] - before[url]).requests)
              for url in engines}
    return {engine: n for engine, n in served.items() if n > 0}


def _split(result: DriveResult) -> None:
    """HBM / DDR shares from the engines' counters (usage's cached_tokens has only the sum)."""
    counters = result.counters
    stats = result.stats
    if counters is None or counters.queries <= 0:
        stats.hbm_tokens = stats.ddr_tokens = None
        return
    stats.hbm_tokens = round(counters.hits / counters.queries * stats.prompt_tokens)
    stats.ddr_tokens = round(counters.external_hits / counters.queries * stats.prompt_tokens)
