"""The emulator's KV cache events: an in-process fleet, a real ZeroMQ subscriber, real HTTP.

What vLLM sends is in emulator/kv_events.py's docstring (and tests/support/kv_events.py declares
vLLM's structs); here the emulator's stream is held to it: framing, sequences, the events a new
prompt, a next turn, an answer and an eviction give, and decoding with vLLM's definitions.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest

from emulator.command import add_arguments, options_from_args
from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from emulator.processes import share_options
from tests.support.kv_events import ENCODER, Subscriber, block_count, replay
from tests.support.ports import free_ports

BS = 16
MODEL = "Qwen/Qwen2.5-32B-Instruct"
STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
               "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"]


def prompt(n: int, base: int = 1000) -> list[int]:
    return list(range(base, base + n))


class Rig:
    """One emulated instance publishing KV events, a subscriber on it, an HTTP client."""

    def __init__(self, fleet: Fleet, sub: Subscriber, http: aiohttp.ClientSession) -> None:
        self.fleet, self.sub, self.http = fleet, sub, http
        self.url = f"http://{fleet.engines[0]}"
        self.model = fleet.servers[0].model

    async def complete(self, tokens: Sequence[int], max_tokens: int = 1,
                       headers: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"model": MODEL, "prompt": list(tokens), "max_tokens": max_tokens}
        async with self.http.post(f"{self.url}/v1/completions", json=body,
                                  headers=headers or {}) as reply:
            assert reply.status == 200, await reply.text()
            result: dict[str, Any] = await reply.json()
            return result

    async def reset(self) -> bool:
        async with self.http.post(f"{self.url}/reset_prefix_cache") as reply:
            assert reply.status == 200
            return bool((await reply.json())["success"])


async def _rig(hbm_tokens: int) -> AsyncIterator[Rig]:
    pub, rep = free_ports(2)
    options = EmulatorOptions(instances=1, time_scale=0, no_ddr_pool=True, block_size=BS,
                              hbm_tokens=hbm_tokens, kv_events_port=pub,
                              kv_events_replay_port=rep)
    async with Fleet(options) as fleet, aiohttp.ClientSession() as http, \
            Subscriber(f"tcp://127.0.0.1:{pub}", b"kv") as sub:
        rig = Rig(fleet, sub, http)
        await sub.ready(rig.reset)  # an empty cache's reset still says AllBlocksCleared
        yield rig


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async for r in _rig(hbm_tokens=100_000):
        yield r


@pytest.fixture
async def small() -> AsyncIterator[Rig]:
    async for r in _rig(hbm_tokens=8 * BS):  # eight blocks
        yield r


def stored(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "BlockStored"]


async def test_a_new_prompt_stores_its_full_blocks_in_one_event(rig: Rig) -> None:
    tokens = prompt(5 * BS + 3)
    await rig.complete(tokens)
    events = await rig.sub.collect(lambda ev: len(stored(ev)) >= 1)
    assert len(events) == 1
    event = events[0]
    assert list(event) == STORED_KEYS  # vLLM's field order; defaults it omits are absent
    assert event["block_hashes"] == rig.model.hashes(tokens)
    assert event["parent_block_hash"] is None
    assert event["token_ids"] == tokens[: 5 * BS]
    assert (event["block_size"], event["medium"], event["group_idx"]) == (BS, "GPU", 0)
    assert event["extra_keys"] == [None] * 5
    assert (event["lora_id"], event["lora_name"]) == (None, None)
    assert event["kv_cache_spec_kind"] == "full_attention"


async def test_framing_sequences_and_vllms_own_structs(rig: Rig) -> None:
    await rig.complete(prompt(3 * BS + 1), max_tokens=2 * BS + 4)
    await rig.complete(prompt(2 * BS, base=5000))
    await rig.sub.collect(lambda ev: len(stored(ev)) >= 4)
    messages = rig.sub.received
    assert all(m.topic == b"kv" for m in messages)
    seqs = [m.seq for m in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive, one per batch
    # The replay socket has every message from 0: the readiness resets, then these.
    replayed = await replay(f"tcp://127.0.0.1:{rig.fleet.publishers[0].replay_port}", 0)
    assert [m.seq for m in replayed] == list(range(seqs[-1] + 1))
    assert [m.payload for m in replayed[-len(messages):]] == [m.payload for m in messages]
    assert replayed[0].events == [{"type": "AllBlocksCleared"}]
    for m in messages:
        ts, events, rank = m.batch
        assert isinstance(ts, float) and isinstance(events, list) and rank == 0
        typed = m.typed()  # vLLM's decoder accepts it ...
        assert ENCODER.encode(typed) == m.payload  # ... and its encoder gives the same bytes
        assert typed.data_parallel_rank == 0


async def test_a_next_turn_stores_only_its_new_blocks_chained_to_the_last(rig: Rig) -> None:
    first = prompt(5 * BS + 3)
    await rig.complete(first)
    [turn1] = await rig.sub.collect(lambda ev: len(ev) >= 1)
    second = first + prompt(3 * BS, base=9000)
    reply = await rig.complete(second)
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 5 * BS
    [turn2] = await rig.sub.collect(lambda ev: len(ev) >= 1)
    hashes = rig.model.hashes(second)
    assert turn2["block_hashes"] == hashes[5:8]
    assert turn2["parent_block_hash"] == turn1["block_hashes"][-1] == hashes[4]
    assert turn2["token_ids"] == second[5 * BS : 8 * BS]


async def test_an_answer_stores_one_event_per_block_it_fills(rig: Rig) -> None:
    tokens = prompt(2 * BS + 5)
    await rig.complete(tokens, max_tokens=3 * BS)
    # prompt (37) + answer without its last token (47) = 84 tokens: 5 full blocks, 2 the prompt's
    events = await rig.sub.collect(lambda ev: len(ev) >= 4)
    assert [len(e["block_hashes"]) for e in events] == [2, 1, 1, 1]
    chain = [h for e in events for h in e["block_hashes"]]
    assert [e["parent_block_hash"] for e in events] == [None, *(chain[i] for i in (1, 2, 3))]
    assert events[1]["token_ids"][:5] == tokens[2 * BS :]  # the prompt's partial block, filled
    assert all(len(e["token_ids"]) == BS * len(e["block_hashes"]) for e in events)


async def test_a_session_id_rides_on_the_stores(rig: Rig) -> None:
    await rig.complete(prompt(2 * BS + 1), headers={"X-Session-ID": "s-42"})
    [event] = await rig.sub.collect(lambda ev: len(ev) >= 1)
    assert event["session_id"] == "s-42"
    assert list(event) == [*STORED_KEYS, "session_id"]


async def test_eviction_removes_exactly_the_evicted_blocks_tail_first(small: Rig) -> None:
    a = prompt(6 * BS + 1)
    await small.complete(a)  # 6 cached blocks, 1 more held while it ran
    await small.sub.collect(lambda ev: len(ev) >= 1)
    before = small.model.cache.blocks()
    b = prompt(6 * BS + 1, base=7000)
    await small.complete(b)  # needs 7 of 8 blocks: 5 of a's go, its end first
    events = await small.sub.collect(lambda ev: len(stored(ev)) >= 1)
    gone = before - small.model.cache.blocks()
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    assert len(gone) == 5 and block_count(events, "BlockRemoved") == 5
    assert all(list(e) == ["type", "block_hashes", "medium", "group_idx"] for e in removed)
    assert [e["block_hashes"][0] for e in removed] == small.model.hashes(a)[::-1][:5]
    assert events[-1]["type"] == "BlockStored"  # removals first, as vLLM allocates then caches
    assert events[-1]["block_hashes"] == small.model.hashes(b)


async def test_a_reset_clears_all_blocks(rig: Rig) -> None:
    await rig.complete(prompt(2 * BS + 1))
    await rig.sub.collect(lambda ev: len(ev) >= 1)
    assert await rig.reset()
    assert await rig.sub.collect(lambda ev: len(ev) >= 1) == [{"type": "AllBlocksCleared"}]
    assert len(rig.model.cache) == 0


def test_each_instance_and_process_takes_the_next_ports() -> None:
    options = EmulatorOptions(instances=4, processes=2, kv_events_port=7000,
                              kv_events_replay_port=7100)
    second = share_options(options, range(2, 4), None)
    assert (second.kv_events_port, second.kv_events_replay_port) == (7002, 7102)
    off = share_options(EmulatorOptions(instances=4, processes=2), range(2, 4), None)
    assert (off.kv_events_port, off.kv_events_replay_port) == (0, 0)
    with pytest.raises(ValueError, match="kv_events_replay_port needs"):
        EmulatorOptions(kv_events_replay_port=7100).validate()


def test_the_flags_reach_the_options() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kv-events-port", "7000", "--kv-events-replay-port", "7100",
                              "--kv-events-topic", "t"])
    options = options_from_args(args)
    assert (options.kv_events_port, options.kv_events_replay_port) == (7000, 7100)
    assert options.kv_events_topic == "t"
    assert options_from_args(parser.parse_args([])).kv_events_port == 0  # off by default
