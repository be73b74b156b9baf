"""The prefix step live (`placement.load_gate.prefix_placement`), through the real gateway (etcd,
control plane, ext_proc, Envoy) with a stock OpenAI client: new sessions that open with the same
long template land on the engine that already holds it, the load bound still spreads them, and
a bound session's turns never send their body to ext_proc."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config import Config
from kvgate.endpoints import EndpointDirectory
from kvgate.placement import place, session_hash
from tests.support.fleet import EngineProcesses
from tests.support.stack import gateway_config, running_stack

ENGINES = 3
# A tool-agent's harness: ~6,000 tokens every session opens with.
TEMPLATE = ("You are a coding agent. Tools:\n"
            + "def read_file(path: str) -> str:\n    return open(path).read()\n" * 300)


@dataclass
class Gateway:
    config: Config
    fleet: EngineProcesses
    client: openai.AsyncOpenAI
    http: aiohttp.ClientSession
    model: str

    async def ext_proc_metric(self, name: str) -> float:
        async with self.http.get(f"http://{self.config.ext_proc.metrics}/metrics") as reply:
            text = await reply.text()
        return sum(s.value for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == name)

    async def envoy_stat(self, suffix: str) -> int:
        async with self.http.get(f"http://{self.config.envoy_admin}/stats") as reply:
            text = await reply.text()
        found = [int(line.rsplit(":", 1)[1]) for line in text.splitlines()
                 if ".ext_proc." in line and line.split(":", 1)[0].endswith(suffix)]
        assert found, f"no ext_proc stat ending in {suffix}"
        return sum(found)

    def ring_first(self, session: str) -> str:
        """Where Envoy's ring (and a placement that weighs no prompt) puts `session`."""
        view = EndpointDirectory(self.config).view("coder")
        found = place(view, session_hash(session.encode()), {}, 1.0)
        assert found is not None
        return found


@pytest.fixture
async def gateway(tmp_path: Path, prefix: str) -> AsyncIterator[Gateway]:
    fleet = EngineProcesses(ENGINES, tmp_path / "fleet")
    await fleet.start()
    try:
        # load_factor 2: of three sessions on three engines, one engine holds at most two. The
        # engines run at time scale 0 (a prefill takes no time): the gate is told they are
        # fast, so a turn just sent does not look queued on its engine.
        config = gateway_config(fleet.engines, prefix=prefix, load_factor=2.0, placement={
            "load_gate": {"prefix_placement": True},
            "engine_cost": {"prefill_tokens_per_s": 1e6}})
        async with running_stack(config, tmp_path / "stack"), aiohttp.ClientSession() as http:
            client = openai.AsyncOpenAI(base_url=f"http://{config.listener}/v1",
                                        api_key="unused", max_retries=0)
            try:
                model = (await client.models.list()).data[0].id
                yield Gateway(config, fleet, client, http, model)
            finally:
                await client.close()
    finally:
        await fleet.stop()


async def turn(gateway: Gateway, session: str, messages: list[dict[str, str]]
               ) -> tuple[str, int, str]:
    """One turn: the engine that served it, its cached prompt tokens, the answer."""
    raw = await gateway.client.chat.completions.with_raw_response.create(
        model=gateway.model, messages=messages, max_tokens=8,  # type: ignore[arg-type]
        extra_headers={"x-session-id": session})
    reply = raw.parse()
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return raw.headers["x-engine-id"], cached, reply.choices[0].message.content or ""


def opening(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": TEMPLATE}, {"role": "user", "content": question}]


async def test_template_sessions_land_on_its_holder_and_sticky_turns_send_no_body(
        gateway: Gateway) -> None:
    first, cached, _ = await turn(gateway, "tpl-0", opening("Fix the parser."))
    assert cached == 0  # nothing held anywhere yet
    assert await gateway.ext_proc_metric("kvgate_ext_proc_prompts_read_total") == 1

    # A second new session whose ring would put it elsewhere: its template is on `first`.
    other = next(f"tpl-{i}" for i in range(1, 200) if gateway.ring_first(f"tpl-{i}") != first)
    second, cached, answer = await turn(gateway, other, opening("Add a test for the lexer."))
    assert second == first
    assert cached >= 5000  # the engine's prefix cache hit the shared template
    assert await gateway.ext_proc_metric("kvgate_ext_proc_prompts_read_total") == 2

    # A third: `first` holds two of three sessions, the load bound's most; it goes elsewhere.
    third = next(f"tpl-{i}" for i in range(200, 400) if gateway.ring_first(f"tpl-{i}") != first)
    placed, _, _ = await turn(gateway, third, opening("Rename the module."))
    assert placed != first
    assert await gateway.ext_proc_metric("kvgate_ext_proc_prompts_read_total") == 3

    # Sticky turns: decided from their headers, no body asked for, one message each way.
    sent = await gateway.envoy_stat("stream_msgs_sent")
    messages = [*opening("Add a test for the lexer."), {"role": "assistant", "content": answer},
                {"role": "user", "content": "Now run it."}]
    for _ in range(3):
        served, cached, _ = await turn(gateway, other, messages)
        assert served == first and cached >= 5000
    assert await gateway.ext_proc_metric("kvgate_ext_proc_prompts_read_total") == 3
    assert await gateway.envoy_stat("stream_msgs_sent") - sent == 3
