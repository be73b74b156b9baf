"""ext_proc's stream for routes to prefill/decode pools: the two-stage wire, inside the gateway.

Why here: ext_proc already decides the decode engine; with the route's body buffered (the
route's `processing_mode` override, set only for P/D pools) it reads the body once, runs the
prefill on the chosen prefill engine, and hands Envoy the decode request (the client's body plus
the prefill's `kv_transfer_params`). Envoy then sends it to the decode engine and streams that
engine's answer to the client as for any request. No extra process, no extra hop for the
answer, and colocated pools keep their one-message stream (ext_proc.server).

The stream: request headers → the decision (the decode engine, as for any request) → the body
→ the turn's plan (kvgate.pd.decider) → if a prefill engine takes it: a longer message deadline
for this message (Envoy's `max_message_timeout`), the prefill, and the body replaced; on any
failure the body goes on unchanged and the decode engine prefills the turn.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import grpc
import structlog
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry, Counter, Histogram

from ext_proc.answers import Answers, protobuf_answer
from ext_proc.server import decision_inputs, pool_of
from kvgate.config.model import Config
from kvgate.config.sections.disaggregation import SkipRule
from kvgate.endpoints import EndpointDirectory
from kvgate.etcd import EtcdClient
from kvgate.fleet.hbm_board import HbmBoard
from kvgate.pd.decider import Path, Plan, PrefillDecider
from kvgate.pd.turns import TurnLog, TurnRecord
from kvgate.pd.wire import PrefillFailed, compact, decode_request, parse, prefill
from kvgate.placement.live import LoadBoard
from kvgate.routing.handler import RequestHandler
from kvgate.routing.prompt_blocks import PromptBlocks

log = structlog.get_logger("kvgate.ext_proc.pd")
Context = grpc.aio.ServicerContext[pb.ProcessingRequest, bytes]


class PdMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.turns = Counter(
            "kvgate_ext_proc_pd_turns", "Turns of prefill/decode pools by how they were "
            "prefilled: remote (on a prefill engine), skipped_cached (the decode engine "
            "lacked fewer tokens than disaggregation.skip_prefill_below), "
            "skipped_no_prefill_engine, skipped_unplaced, prefill_failed (the decode engine "
            "prefilled it)", ["path"], registry=registry)
        for path in Path:
            self.turns.labels(path.value)
        self.prefills = Counter(
            "kvgate_ext_proc_pd_prefills", "Turns each prefill engine prefilled", ["engine"],
            registry=registry)
        self.prefill_seconds = Histogram(
            "kvgate_ext_proc_pd_prefill_seconds", "A prefill engine's time to hand over a turn",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=registry)


class PdProcessor:
    def __init__(self, handler: RequestHandler, decider: PrefillDecider, metrics: PdMetrics,
                 *, timeout_s: float, prompt_tokens: Callable[[int], int],
                 session_headers: tuple[str, ...], turns: TurnLog | None = None,
                 blocks: PromptBlocks | None = None) -> None:
        """`blocks`: counts a prompt's whole blocks of the decider's `block_tokens`, so what the
        decode engine's KV events hold is put in the estimate's units (held_context)."""
        self._handler = handler
        self._blocks = blocks
        self._turns = turns  # each session's latest turn, for `kvgate sessions show`
        self._decider = decider
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._prompt_tokens = prompt_tokens  # a body's bytes -> its prompt's tokens
        self._session_headers = session_headers
        self._answers = Answers(protobuf_answer)
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._turns is not None:
            await self._turns.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def process(self, requests: AsyncIterator[pb.ProcessingRequest],
                      context: Context) -> AsyncIterator[bytes]:
        first = await anext(requests, None)
        if first is None or not first.HasField("request_headers"):
            return
        headers, fields = decision_inputs(first)
        pool = pool_of(context) or self._handler.default_pool
        decision = await self._handler.decide(pool, headers, fields)
        yield self._answers.of(decision)
        if first.request_headers.end_of_stream:
            return  # no body: nothing to prefill
        message = await anext(requests, None)
        if message is None or not message.HasField("request_body"):
            return
        body = message.request_body.body
        client = parse(body)
        decode = decision.endpoints[0] if decision.endpoints and client is not None else None
        prompt = self._prompt_tokens(len(body))
        full = 0 if client is None or self._blocks is None else self._blocks.full(client)
        plan = self._decider.plan(pool or "", decode, decision.session, prompt, full)
        replaced: bytes | None = None
        if client is not None and "kv_transfer_params" in client:
            # A client never names KV to pull (an address the decode engine would connect to).
            client.pop("kv_transfer_params")
            replaced = compact(client)
        if plan.path is Path.REMOTE:
            assert client is not None and plan.prefill is not None
            # This message may now take the prefill's time (within max_message_timeout).
            yield _longer_deadline(self._timeout_s + 1.0)
            replaced, plan = await self._prefill(client, plan, prompt, headers, replaced)
        self._metrics.turns.labels(plan.path.value).inc()
        log.info("pd_turn", pool=pool, session=decision.session, decode=decode,
                 prefill=plan.prefill, path=plan.path.value, lacking_tokens=plan.lacking_tokens,
                 estimate=plan.source)
        if self._turns is not None and pool and decision.session and decode:
            self._turns.note(pool, decision.session, TurnRecord(
                plan.path.value, decode, plan.prefill, plan.lacking_tokens, time.time()))
        yield _body_answer(replaced)

    async def _prefill(self, client: dict[str, Any], plan: Plan, prompt: int,
                       headers: dict[str, bytes], unchanged: bytes | None,
                       ) -> tuple[bytes | None, Plan]:
        """The decode request's body, or `unchanged` when the prefill failed."""
        assert plan.prefill is not None
        if self._http is None:
            self._http = aiohttp.ClientSession()
        path = "/v1/chat/completions" if "messages" in client else "/v1/completions"
        forwarded = {name: headers[name].decode("latin-1")
                     for name in self._session_headers if name in headers}
        self._decider.started(plan.prefill, prompt)
        started = time.perf_counter()
        try:
            params = await prefill(self._http, plan.prefill, path, client, forwarded,
                                   self._timeout_s)
        except PrefillFailed as exc:
            log.warning("pd_prefill_failed", prefill=plan.prefill, error=str(exc),
                        fallback="the decode engine prefills the turn")
            return unchanged, Plan(Path.FAILED, plan.prefill, plan.lacking_tokens, plan.source)
        finally:
            self._decider.ended(plan.prefill, prompt)
        self._metrics.prefill_seconds.observe(time.perf_counter() - started)
        self._metrics.prefills.labels(plan.prefill).inc()
        return decode_request(client, params), plan


def _longer_deadline(seconds: float) -> bytes:
    response = pb.ProcessingResponse()
    response.override_message_timeout.FromNanoseconds(int(seconds * 1e9))
    answer: bytes = response.SerializeToString()
    return answer


def _body_answer(body: bytes | None) -> bytes:
    common = pb.CommonResponse()
    if body is not None:
        common.body_mutation.body = body
        common.header_mutation.set_headers.append(base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key="content-length", raw_value=str(len(body)).encode()),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD))
    answer: bytes = pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common)).SerializeToString()
    return answer


def build_pd(config: Config, handler: RequestHandler, directory: EndpointDirectory,
             registry: CollectorRegistry, *, hbm: HbmBoard | None,
             board: LoadBoard | None, etcd: EtcdClient | None,
             blocks: PromptBlocks) -> PdProcessor | None:
    """The P/D stream's processor when a pool has prefill engines (None: colocated only).
    `blocks`: how the gate cuts a prompt into blocks (the decider counts a prompt's in them)."""
    if not any(pool.disaggregated for pool in config.pools):
        return None
    settings, gate = config.disaggregation, config.placement.load_gate

    def backlog_s(address: str) -> float:
        assert board is not None
        return board.backlog_s(address, time.monotonic())  # the board's clock

    def running(address: str) -> int | None:  # the engine's last report, if fresh
        assert board is not None
        seen = board.observed(address, time.monotonic())
        return None if seen is None else seen.figures.running

    decider = PrefillDecider(directory, settings.skip_prefill_below,
                             hbm_tokens=None if hbm is None else hbm.hbm_tokens,
                             backlog_s=None if board is None else backlog_s,
                             cost=config.placement.engine_cost,
                             rule=SkipRule(settings.skip_rule),
                             running=None if board is None else running,
                             block_tokens=blocks.block_tokens)  # as the gate's (_policy)
    return PdProcessor(handler, decider, PdMetrics(registry),
                       timeout_s=settings.prefill_timeout,
                       prompt_tokens=gate.prompt_tokens,
                       session_headers=config.session.headers,
                       turns=None if etcd is None else TurnLog(etcd, config.etcd.prefix,
                                                               config.session.idle_ttl),
                       blocks=blocks)
