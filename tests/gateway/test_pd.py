"""Prefill/decode pools through the real gateway (etcd, control plane, ext_proc, Envoy) with a
stock OpenAI client: a session's long first turn is prefilled on a prefill engine and decoded
on its decode engine, its short next turn never reaches a prefill engine, and a prefill engine
killed under traffic fails no request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config import Config
from tests.admin.admin_helpers import run_cli
from tests.support.fleet import EngineProcesses
from tests.support.polling import eventually
from tests.support.stack import gateway_config, running_stack

ROLES = ("prefill", "prefill", "decode", "decode")
CODE = "def handler(event, context):\n    return event['body']\n" * 400  # ~6,000 tokens


@dataclass
class PdGateway:
    config: Config
    fleet: EngineProcesses
    client: openai.AsyncOpenAI
    http: aiohttp.ClientSession
    model: str

    @property
    def prefills(self) -> list[str]:
        return [e for e, r in zip(self.fleet.engines, ROLES, strict=True) if r == "prefill"]

    @property
    def decodes(self) -> list[str]:
        return [e for e, r in zip(self.fleet.engines, ROLES, strict=True) if r == "decode"]

    async def stats(self, engine: str) -> dict[str, Any]:
        async with self.http.get(f"http://{engine}/admin/stats") as reply:
            found: dict[str, Any] = await reply.json()
            return found

    async def last_turn(self, session: str) -> dict[str, Any] | None:
        """`kvgate sessions show SESSION --json`'s record of the session's latest turn."""
        shown = await run_cli("sessions", "show", session, "--json",
                              admin=str(self.config.control_plane.admin))
        assert shown.code == 0, shown.err
        turn: dict[str, Any] | None = json.loads(shown.out)[0]["last_turn"]
        return turn

    async def turns(self) -> dict[str, float]:
        async with self.http.get(f"http://{self.config.ext_proc.metrics}/metrics") as reply:
            text = await reply.text()
        return {s.labels["path"]: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "kvgate_ext_proc_pd_turns_total"}


@pytest.fixture
async def gateway(tmp_path: Path, prefix: str) -> AsyncIterator[PdGateway]:
    fleet = EngineProcesses(len(ROLES), tmp_path / "fleet", roles=ROLES)
    await fleet.start()
    try:
        endpoints = [{"address": e, "role": r} for e, r in zip(fleet.engines, ROLES, strict=True)]
        config = gateway_config(endpoints, prefix=prefix,
                                health={"interval": "1s", "timeout": "1s",
                                        "unhealthy_threshold": 2, "healthy_threshold": 1})
        async with running_stack(config, tmp_path / "stack"), aiohttp.ClientSession() as http:
            client = openai.AsyncOpenAI(base_url=f"http://{config.listener}/v1",
                                        api_key="unused", max_retries=0)
            try:
                model = (await client.models.list()).data[0].id
                yield PdGateway(config, fleet, client, http, model)
            finally:
                await client.close()
    finally:
        await fleet.stop()


def opening(topic: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a coding assistant.\n" + CODE},
            {"role": "user", "content": f"About {topic}: what does this code do?"}]


async def test_long_turn_prefilled_remotely_short_turn_stays_on_decode(
        gateway: PdGateway) -> None:
    client, session = gateway.client, {"x-session-id": "pd-session-1"}
    messages = opening("handlers")
    raw = await client.chat.completions.with_raw_response.create(
        model=gateway.model, messages=messages, max_tokens=16,  # type: ignore[arg-type]
        extra_headers=session)
    first = raw.parse()
    decode = raw.headers["x-engine-id"]
    assert decode in gateway.decodes
    usage = first.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens > 4000 and usage.completion_tokens == 16
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens, usage
    pulled = [(await gateway.stats(p))["kv_transfer"]["pulled"] for p in gateway.prefills]
    assert sum(pulled) == 1
    assert (await gateway.turns())["remote"] == 1
    turn = await eventually(lambda: gateway.last_turn("pd-session-1"), what="a recorded turn")
    assert turn is not None
    assert (turn["path"], turn["decode"]) == ("remote", decode)
    assert turn["prefill"] in gateway.prefills and turn["lacking_tokens"] > 4000
    seen = [(await gateway.stats(p))["requests"] for p in gateway.prefills]

    # The next short turn: its decode engine holds the conversation, no prefill engine is asked.
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "And what if the body is missing?"}]
    host, port = gateway.prefills[0].rsplit(":", 1)
    forged = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0],
              "remote_engine_id": "x", "remote_request_id": "prefill-1", "remote_host": host,
              "remote_port": int(port)}  # a client never names KV to pull: stripped
    raw = await client.chat.completions.with_raw_response.create(
        model=gateway.model, messages=messages, max_tokens=8,  # type: ignore[arg-type]
        extra_headers=session, extra_body={"kv_transfer_params": forged})
    assert raw.headers["x-engine-id"] == decode
    assert (await gateway.stats(decode))["kv_transfer"]["failed_pulls"] == 0
    assert [(await gateway.stats(p))["requests"] for p in gateway.prefills] == seen
    assert (await gateway.turns())["skipped_cached"] == 1
    turn = await eventually(lambda: gateway.last_turn("pd-session-1"),
                            until=lambda t: t is not None and t["path"] != "remote",
                            what="the short turn recorded")
    assert turn is not None and turn["path"] == "skipped_cached" and turn["prefill"] is None
    assert turn["lacking_tokens"] < 2048
    shown = await run_cli("sessions", "show", "pd-session-1",
                          admin=str(gateway.config.control_plane.admin))
    assert "no prefill engine (skipped_cached: its decode engine lacked" in shown.out

    # A new session's long turn, streamed: prefilled remotely, streamed from its decode engine.
    stream = await client.chat.completions.with_raw_response.create(
        model=gateway.model, messages=opening("streams"), max_tokens=12,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True},
        extra_headers={"x-session-id": "pd-session-2"})
    assert stream.headers["x-engine-id"] in gateway.decodes
    chunks = [chunk async for chunk in stream.parse()]
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2
    last = chunks[-1].usage
    assert last is not None and last.prompt_tokens_details is not None
    assert last.prompt_tokens_details.cached_tokens >= 0.9 * last.prompt_tokens
    assert (await gateway.turns())["remote"] == 2

    # Prefill engines that refuse (503): the decode engine prefills the turn, nothing fails.
    for engine in gateway.prefills:
        async with gateway.http.post(f"http://{engine}/admin/fault",
                                     json={"mode": "error503"}) as reply:
            assert reply.status == 200
    refused = await client.chat.completions.with_raw_response.create(
        model=gateway.model, messages=opening("refusals"), max_tokens=8,  # type: ignore[arg-type]
        extra_headers={"x-session-id": "pd-session-3"})
    assert refused.headers["x-engine-id"] in gateway.decodes
    answer = refused.parse()
    assert answer.choices[0].message.content and answer.usage is not None
    assert answer.usage.prompt_tokens > 4000
    assert (await gateway.turns())["prefill_failed"] == 1


async def test_a_prefill_engine_killed_under_traffic_fails_nothing(gateway: PdGateway) -> None:
    failures: list[str] = []
    done = 0
    warmed = asyncio.Event()  # six turns answered: the kill lands under traffic

    async def conversation(n: int) -> None:
        nonlocal done
        for turn in range(6):  # a new long session per turn: every turn wants a prefill
            try:
                # The session in the body (prompt_cache_key): Envoy reads it before ext_proc.
                answer = await gateway.client.chat.completions.create(
                    model=gateway.model, messages=opening(f"c{n}t{turn}"),  # type: ignore[arg-type]
                    max_tokens=8, prompt_cache_key=f"kill-{n}-{turn}")
                assert answer.choices[0].message.content
            except Exception as exc:  # any failure counts; the test reports them all
                failures.append(f"{n}/{turn}: {type(exc).__name__}: {exc}")
            done += 1
            if done >= 6:
                warmed.set()

    traffic = [asyncio.create_task(conversation(n)) for n in range(6)]
    await asyncio.wait_for(warmed.wait(), 60)
    assert done < 36  # still under traffic
    victim = gateway.prefills[0]
    gateway.fleet.child_of(victim).kill()
    await asyncio.gather(*traffic)
    assert failures == []
    assert done == 36
    turns = await gateway.turns()
    assert turns["remote"] >= 6  # prefill engines did prefill before and after the kill
    assert turns["skipped_unplaced"] == 0  # every turn had its session and decode engine
    survivor = (await gateway.stats(gateway.prefills[1]))["kv_transfer"]["pulled"]
    assert survivor >= 1
