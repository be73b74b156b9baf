"""The per-turn prefill decision of prefill/decode pools, and the wire's request bodies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from control_plane.resources.listener import _ext_proc
from control_plane.resources.routes import route_configuration
from ext_proc.pd_stream import PdMetrics, PdProcessor
from kvgate.config import Config, load_text
from kvgate.contract.envoy import EXT_PROC_FILTER, PD_METADATA_KEY
from kvgate.endpoints.directory import EndpointDirectory
from kvgate.endpoints.records import EndpointRecord
from kvgate.pd.decider import Path, PrefillDecider
from kvgate.pd.wire import PREFILL_PARAMS, decode_request, prefill_request
from kvgate.placement.cost import EngineCost
from kvgate.routing.decision import Decision, Outcome
from kvgate.routing.prompt_blocks import PromptBlocks

PD = """
pools:
  - name: coder
    endpoints:
      - {address: 10.0.0.1:8000, role: prefill}
      - {address: 10.0.0.2:8000, role: prefill}
      - {address: 10.0.0.3:8000, role: decode}
  - name: chat
    endpoints: [10.0.1.1:8000]
routes:
  - {match: {prefix: /chat/}, pool: chat}
  - {match: {prefix: /}, pool: coder}
"""
D = "10.0.0.3:8000"


def test_a_long_new_turn_goes_to_a_prefill_engine_a_short_one_stays() -> None:
    decider = PrefillDecider(EndpointDirectory(load_text(PD)), 2048)
    first = decider.plan("coder", D, "s1", 6000)
    assert first.path is Path.REMOTE and first.prefill in {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert (first.lacking_tokens, first.source) == (6000, "new")
    # The next turn adds 300 tokens to what its decode engine holds: under the threshold.
    second = decider.plan("coder", D, "s1", 6300)
    assert (second.path, second.lacking_tokens, second.source) == (Path.CACHED, 300, "binding")
    # Moved to another decode engine: it lacks the whole prompt again.
    assert decider.plan("coder", "10.0.0.9:8000", "s1", 6400).path is Path.REMOTE
    assert decider.plan("coder", D, None, 1000).path is Path.CACHED  # short, sessionless
    assert decider.plan("coder", None, "s2", 9000).path is Path.SESSIONLESS


def test_kv_events_take_precedence_over_the_binding() -> None:
    held = {(D, "s1"): 5000}
    decider = PrefillDecider(EndpointDirectory(load_text(PD)), 2048,
                             hbm_tokens=lambda e, s, n: min(n, held[e, s]) if (e, s) in held
                             else None)
    plan = decider.plan("coder", D, "s1", 9000)  # first seen here, but its engine holds 5,000
    assert (plan.path, plan.lacking_tokens, plan.source) == (Path.REMOTE, 4000, "kv_events")
    held[D, "s1"] = 8000
    assert decider.plan("coder", D, "s1", 9000).path is Path.CACHED


def test_the_prefill_engine_whose_queue_ends_first_and_none_when_all_failed() -> None:
    directory = EndpointDirectory(load_text(PD))
    backlog = {"10.0.0.1:8000": 2.0, "10.0.0.2:8000": 0.5}
    decider = PrefillDecider(directory, 0, backlog_s=backlog.__getitem__)
    assert {decider.plan("coder", D, f"s{i}", 100).prefill for i in range(4)} == {
        "10.0.0.2:8000"}
    even = PrefillDecider(directory, 0)  # no load known: in-flight prefills, then round robin
    picks = [even.plan("coder", D, f"t{i}", 100).prefill for i in range(4)]
    assert len(set(picks)) == 2
    busy = even.plan("coder", D, "u", 100).prefill
    assert busy is not None
    even.started(busy, 100)
    assert all(even.plan("coder", D, f"v{i}", 100).prefill != busy for i in range(3))
    even.ended(busy, 100)
    for address in ("10.0.0.1:8000", "10.0.0.2:8000"):
        directory.set_record(EndpointRecord("coder", address, "coder", healthy=False,
                                            role=load_text(PD).pools[0].endpoints[0].role))
    directory.set_record(EndpointRecord("coder", D, "coder",
                                        role=load_text(PD).pools[0].endpoints[2].role))
    assert even.plan("coder", D, "w", 9000).path is Path.NO_PREFILL_ENGINE


def test_a_long_prompt_in_flight_weighs_its_seconds_not_one_request() -> None:
    cost = EngineCost(prefill_tokens_per_s=5000.0, prefill_overhead_s=0.02)
    decider = PrefillDecider(EndpointDirectory(load_text(PD)), 0, cost=cost)
    long, idle = "10.0.0.1:8000", "10.0.0.2:8000"
    decider.started(long, 40_000)  # a 40,000-token prompt: 8 s of prefill, one request
    assert decider.inflight_s(long) == cost.prefill_s(40_000, 40_000)
    assert {decider.plan("coder", D, f"s{i}", 500).prefill for i in range(4)} == {idle}
    # Two short prefills on the idle engine still weigh less than the one long prompt.
    decider.started(idle, 500)
    decider.started(idle, 500)
    assert decider.plan("coder", D, "t", 500).prefill == idle
    # A backlog the gate sees counts when it is the larger; this replica's own when it is.
    seen = {long: 0.0, idle: 9.0}
    with_board = PrefillDecider(EndpointDirectory(load_text(PD)), 0, cost=cost,
                                backlog_s=seen.__getitem__)
    with_board.started(long, 40_000)
    assert with_board.plan("coder", D, "u", 500).prefill == long  # 8.02 s < 9 s
    seen[idle] = 1.0
    assert with_board.plan("coder", D, "v", 500).prefill == idle  # max(1, 0) < 8.02 s


def test_ended_releases_exactly_its_tokens() -> None:
    cost = EngineCost()
    decider = PrefillDecider(EndpointDirectory(load_text(PD)), 0, cost=cost)
    engine = "10.0.0.1:8000"
    decider.started(engine, 3000)
    decider.started(engine, 7000)
    decider.ended(engine, 7000)
    assert decider.inflight_s(engine) == cost.prefill_s(3000, 3000)
    decider.ended(engine, 999)  # never started: nothing else is released
    assert decider.inflight_s(engine) == cost.prefill_s(3000, 3000)
    decider.ended(engine, 3000)
    assert decider.inflight_s(engine) == 0.0
    decider.ended(engine, 3000)  # released twice: still nothing in flight, never negative
    assert decider.inflight_s(engine) == 0.0


def test_the_wire_follows_vllms_proxy() -> None:
    client = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
              "max_completion_tokens": 50, "stream": True,
              "stream_options": {"include_usage": True}}
    first = prefill_request(client)
    assert first["kv_transfer_params"] == PREFILL_PARAMS
    assert (first["max_tokens"], first["max_completion_tokens"], first["stream"]) == (1, 1, False)
    assert "stream_options" not in first and client["max_tokens"] == 50  # the client's intact
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "10.0.0.1",
              "remote_port": 8000, "remote_engine_id": "e", "vendor_field": {"x": 1}}
    second = json.loads(decode_request(client, params))
    assert second == {**client, "kv_transfer_params": params}  # pasted verbatim


def test_only_pd_routes_read_the_body() -> None:
    config = load_text(PD)
    routes = {r.name.split(":")[0]: r for r in
              route_configuration(config).virtual_hosts[0].routes if ":" in r.name}
    pd = ext_proc_pb2.ExtProcPerRoute()
    routes["coder"].typed_per_filter_config[EXT_PROC_FILTER].Unpack(pd)
    assert pd.overrides.processing_mode.request_body_mode == pd.overrides.processing_mode.BUFFERED
    assert PD_METADATA_KEY in {h.key for h in pd.overrides.grpc_initial_metadata}
    colocated = ext_proc_pb2.ExtProcPerRoute()
    routes["chat"].typed_per_filter_config[EXT_PROC_FILTER].Unpack(colocated)
    assert not colocated.overrides.HasField("processing_mode")
    assert PD_METADATA_KEY not in {h.key for h in colocated.overrides.grpc_initial_metadata}
    assert _processor(config).max_message_timeout.seconds == 31  # prefill_timeout + 1 s
    assert not _processor(load_text("pools: [{name: a, endpoints: [10.0.0.1:1]}]\n")
                          ).HasField("max_message_timeout")


def _processor(config: Config) -> ext_proc_pb2.ExternalProcessor:
    processor = ext_proc_pb2.ExternalProcessor()
    _ext_proc(config).typed_config.Unpack(processor)
    return processor


def test_what_the_kv_events_hold_is_put_in_the_estimates_units() -> None:
    # The prompt is estimated from the body's size (10,000 tokens) and is 100 real blocks of
    # 128 (12,800 tokens); the KV events count real tokens in whole blocks. 75 blocks held:
    # 25 lacking, 2,500 tokens in the estimate's units, over the threshold. Compared raw, the
    # 9,600 held tokens left 400 lacking and the turn skipped the prefill engines.
    held = {(D, "s1"): 75 * 128}
    decider = PrefillDecider(EndpointDirectory(load_text(PD)), 2048,
                             hbm_tokens=lambda e, s, n: min(n, held[e, s]), block_tokens=128)
    plan = decider.plan("coder", D, "s1", 10_000, 100)
    assert (plan.path, plan.lacking_tokens, plan.source) == (Path.REMOTE, 2_500, "kv_events")
    # Estimated high (14,000) and every block held: nothing lacking (raw: 1,200).
    held[D, "s1"] = 100 * 128
    plan = decider.plan("coder", D, "s1", 14_000, 100)
    assert (plan.path, plan.lacking_tokens) == (Path.CACHED, 0)


class _Decided:
    """The decision's side of the stream: every turn is session s1's, on D."""

    default_pool = "coder"

    async def decide(self, pool: str | None, headers: Mapping[str, bytes],
                     body: object) -> Decision:
        return Decision(Outcome.STICKY, (D,), "s1")


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


async def _messages(body: bytes) -> AsyncIterator[pb.ProcessingRequest]:
    length = base_pb2.HeaderValue(key="content-length", raw_value=str(len(body)).encode())
    yield pb.ProcessingRequest(request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[length])))
    yield pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))


async def test_the_stream_gives_the_decider_the_prompts_blocks() -> None:
    # The body carries 12,000 bytes besides the prompt (tools): estimated 13,257 tokens, its
    # prompt is 80 blocks of 128 (512 bytes each) and the decode engine holds all 80. Lacking
    # nothing, it skips the prefill engines. Without the prompt's blocks the stream compared
    # the units raw: 13,257 - 10,240 held = 3,017 lacking, over the threshold: remote.
    content = "x" * (80 * 512 - len("\x1esystem\x1f"))
    body = json.dumps({"model": "m", "messages": [{"role": "system", "content": content}],
                       "tools": "t" * 12_000}).encode()
    decider = PrefillDecider(EndpointDirectory(load_text(PD)), 2048, block_tokens=128,
                             hbm_tokens=lambda e, s, n: min(n, 80 * 128))
    registry = CollectorRegistry()
    processor = PdProcessor(cast(Any, _Decided()), decider, PdMetrics(registry), timeout_s=0.5,
                            prompt_tokens=lambda size: size // 4, session_headers=(),
                            blocks=PromptBlocks(128, 4.0))
    answers = [a async for a in processor.process(_messages(body), cast(Any, _Context()))]
    await processor.close()
    assert len(answers) == 2  # the headers' answer, then the body's (unchanged)
    assert registry.get_sample_value("kvgate_ext_proc_pd_turns_total",
                                     {"path": Path.CACHED.value}) == 1.0
