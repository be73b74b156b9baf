"""A real prefill engine and a real decode engine behind kvgate, the KV carried between them by
the tier's own connector over /dev/shm (real_vllm/pd_connector.py) through vLLM's
`kv_transfer_params`: greedy answers equal a colocated engine's, the decode engine counts the
pulled prompt as cached, a session's short next turn never reaches the prefill engine, and the
prefill engine killed mid-run fails no request.

The pair is this module's own (two more vLLM processes); the kill test runs last and the next
test's fixture starts the prefill engine again."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from real_vllm.fleet import BLOCK_SIZE, SERVED_MODEL, Engine, EngineOptions, RealFleet
from real_vllm.pd_transfer import PdTransfer
from stack.local import Stack
from tests.support.conversation import Conversation, Turn
from tests.support.polling import eventually
from tests.support.real_vllm import (
    UPSTREAM_HEADER,
    pd_gateway_config,
    real_engines,
    up_and_empty,
)

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.timeout(1200)]

# Turns whose decode engine lacks this many tokens (the gateway's estimate from the body's
# bytes) go to the prefill engine: every prompt below but the short next turns.
SKIP_PREFILL_BELOW = 512
P2P = ("vllm:prompt_tokens_cached_by_source", {"source": "p2p"})
FINISHED = ("vllm:request_success", {})


PULL_TIMEOUT_S = 10.0  # the decode engine's wait for a handoff's files, then it recomputes


@pytest.fixture(scope="module")
def transfer() -> Iterator[PdTransfer]:
    with PdTransfer(pull_timeout_s=PULL_TIMEOUT_S) as found:
        yield found


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pair(transfer: PdTransfer,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealFleet]:
    """Engine 0 prefills, engine 1 decodes: the same flags, the gateway gives the roles."""
    options = transfer.engine_options(EngineOptions(kv_cache_gib=1))
    async with real_engines(2, options, "pd", tmp_path_factory.mktemp("pd")) as fleet:
        yield fleet


@dataclass
class PdGateway:
    stack: Stack
    fleet: RealFleet
    http: httpx.AsyncClient

    @property
    def url(self) -> str:
        return f"http://{self.stack.config.listener}"

    @property
    def prefill(self) -> Engine:
        return self.fleet.engines[0]

    @property
    def decode(self) -> Engine:
        return self.fleet.engines[1]

    async def turns(self) -> dict[str, float]:
        """kvgate_ext_proc_pd_turns_total by path."""
        reply = await self.http.get(f"http://{self.stack.config.ext_proc.metrics}/metrics")
        return {s.labels["path"]: s.value
                for f in text_string_to_metric_families(reply.text) for s in f.samples
                if s.name == "kvgate_ext_proc_pd_turns_total"}

    async def metric(self, engine: Engine, which: tuple[str, dict[str, str]]) -> float:
        """A vLLM counter on ``engine``, summed over the series matching the labels."""
        name, labels = which
        reply = await self.http.get(f"{engine.url}/metrics")
        return sum(s.value for f in text_string_to_metric_families(reply.text)
                   for s in f.samples if s.name == f"{name}_total"
                   and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(pair: RealFleet, tmp_path: Path) -> AsyncIterator[PdGateway]:
    """kvgate in front of the pair (the prefill engine started again if a test killed it),
    prefix caches empty."""
    fleet = await up_and_empty(pair)
    prefix = f"/kvgate/real-pd-{tmp_path.name}/"
    config = pd_gateway_config(fleet.engines[0].address, fleet.engines[1].address, prefix,
                               SKIP_PREFILL_BELOW)
    stack = Stack(config, tmp_path / "stack")
    await stack.start()
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            yield PdGateway(stack, fleet, http)
    finally:
        await stack.stop()


def completion(prompt: list[int], answer: int = 24) -> dict[str, Any]:
    return {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": answer, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}


async def complete(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                   headers: dict[str, str] | None = None) -> tuple[str, list[int]]:
    """The engine that answered and the answer's token ids."""
    reply = await http.post(f"{url}/v1/completions", json=body, headers=headers or {})
    assert reply.status_code == 200, reply.text
    return reply.headers.get(UPSTREAM_HEADER, url), reply.json()["choices"][0]["token_ids"]


async def colocated(gateway: PdGateway, prompts: list[list[int]], answer: int) -> list[list[int]]:
    """The same prompts, caches emptied, straight to the decode engine, which prefills them
    itself (no kv_transfer_params): a colocated engine's greedy answers."""
    await up_and_empty(gateway.fleet)
    return [(await complete(gateway.http, gateway.decode.url, completion(p, answer)))[1]
            for p in prompts]


# 640 tokens: five whole blocks; the others end inside a block.
PROMPT_TOKENS = (3000, 1000, 640, 700)


async def test_greedy_answers_through_prefill_and_decode_equal_a_colocated_engines(
        gateway: PdGateway, transfer: PdTransfer) -> None:
    rng = random.Random(43)
    prompts = [[rng.randrange(200, 8000) for _ in range(n)] for n in PROMPT_TOKENS]
    pulled = await gateway.metric(gateway.decode, P2P)
    through = []
    for i, prompt in enumerate(prompts):
        engine, answer = await complete(gateway.http, gateway.url, completion(prompt),
                                        {"x-session-id": f"greedy-{i}"})
        assert engine == gateway.decode.address
        through.append(answer)
    turns = await gateway.turns()
    assert turns["remote"] == len(prompts), turns
    # Every prompt came from the prefill engine, whole: the decode engine computed only the
    # last token of each (vLLM recomputes it to sample the next).
    assert await gateway.metric(gateway.decode, P2P) - pulled == sum(PROMPT_TOKENS)
    assert transfer.pending() == []  # every handoff was pulled, and its files freed
    alone = await colocated(gateway, prompts, 24)
    assert through == alone
    assert len({tuple(a) for a in alone}) == len(alone)  # four different answers compared


async def test_a_long_first_turn_is_pulled_whole_and_the_short_next_turn_skips_prefill(
        gateway: PdGateway, transfer: PdTransfer) -> None:
    talk = Conversation("pd-talk", seed=11, context=3000)
    headers = {"x-session-id": talk.session}
    pulled = await gateway.metric(gateway.decode, P2P)
    prefilled = await gateway.metric(gateway.prefill, FINISHED)
    first = await talk.turn(gateway.http, gateway.url, headers)
    assert first.engine == gateway.decode.address
    turns = await gateway.turns()
    assert turns["remote"] == 1, turns
    assert await gateway.metric(gateway.prefill, FINISHED) - prefilled == 1
    # The decode engine counts the whole prompt as cached, pulled from its peer (vLLM's
    # prompt_tokens_cached_by_source{source="p2p"}). Its usage reports what the prefill engine
    # found cached instead (vLLM 0.32 passes remote_prefill_cached_tokens through the params):
    # nothing, on a first turn.
    assert await gateway.metric(gateway.decode, P2P) - pulled == first.prompt
    assert first.cached == 0
    assert transfer.pending() == []

    second = await talk.turn(gateway.http, gateway.url, headers)
    assert second.engine == gateway.decode.address
    turns = await gateway.turns()
    assert (turns["remote"], turns["skipped_cached"]) == (1, 1), turns
    assert await gateway.metric(gateway.prefill, FINISHED) - prefilled == 1  # never reached
    # The pulled prompt stayed in the decode engine's prefix cache: every whole block of it hits.
    assert second.cached >= first.prompt // BLOCK_SIZE * BLOCK_SIZE, (first, second)
    write, pull = transfer.calls("write")[-1], transfer.calls("pull")[-1]
    print(f"\nfirst turn {first.prompt} tokens pulled ({write['blocks']} blocks, "
          f"{write['bytes'] / 2**20:.0f} MiB written in {write['seconds'] * 1000:.0f} ms, "
          f"read in {pull['seconds'] * 1000:.0f} ms); next turn {second.prompt} tokens, "
          f"{second.cached} cached on the decode engine, prefill engine not asked")


async def test_a_handoff_whose_files_never_come_is_prefilled_on_the_decode_engine(
        gateway: PdGateway, transfer: PdTransfer) -> None:
    """A decode request naming a prefill nobody wrote (its prefill engine died after it
    answered, before its worker wrote the blocks): the decode engine waits PULL_TIMEOUT_S,
    reports the pull failed, and vLLM prefills the prompt itself (kv_load_failure_policy
    recompute). Sent to the engine directly: the gateway lets no client name KV to pull."""
    prompt = [random.Random(5).randrange(200, 8000) for _ in range(1000)]
    params = {"do_remote_prefill": True, "do_remote_decode": False,
              "remote_block_ids": list(range(1, 9)), "remote_engine_id": "gone-engine",
              "remote_request_id": "cmpl-never-written", "remote_host": socket.gethostname(),
              "remote_port": gateway.prefill.port, "tp_size": 1}
    started = time.monotonic()
    _, answer = await complete(gateway.http, gateway.decode.url,
                               {**completion(prompt), "kv_transfer_params": params})
    waited = time.monotonic() - started
    pull = transfer.calls("pull")[-1]
    assert (pull["remote"], pull["ok"], pull["why"]) == ("cmpl-never-written", False, "timed out")
    assert waited >= PULL_TIMEOUT_S
    assert [answer] == await colocated(gateway, [prompt], 24)
    print(f"\na pull that never came: answered after {waited:.1f} s, recomputed, as colocated")


async def test_the_prefill_engine_killed_mid_run_fails_nothing(
        gateway: PdGateway, transfer: PdTransfer) -> None:
    """Six sessions' long first turns at once; the prefill engine is killed as soon as one
    handoff has been pulled. Every request answers, each as a colocated engine would."""
    talks = [Conversation(f"kill-{i}", seed=200 + i, context=2500) for i in range(6)]
    pulls = len(transfer.calls("pull"))

    async def one(talk: Conversation) -> Turn:
        return await talk.turn(gateway.http, gateway.url, {"x-session-id": talk.session})

    running = [asyncio.create_task(one(t)) for t in talks]
    try:
        await eventually(lambda: len(transfer.calls("pull")) > pulls, 300,
                         what="a first pull from the prefill engine")
        gateway.prefill.child.kill()
        done = await asyncio.gather(*running)
    finally:
        for task in running:
            task.cancel()
    assert all(t.engine == gateway.decode.address for t in done)
    turns = await gateway.turns()
    fell_back = turns["prefill_failed"] + turns["skipped_no_prefill_engine"]
    assert turns["remote"] >= 1 and fell_back >= 1, turns
    assert sum(turns.values()) == len(talks), turns
    print(f"\nprefill engine killed mid-run: {len(talks)} requests, 0 failed; turns {turns}")
    prompts = [t.history[:d.prompt] for t, d in zip(talks, done, strict=True)]
    assert [d.answer for d in done] == await colocated(gateway, prompts, talks[0].answer)
