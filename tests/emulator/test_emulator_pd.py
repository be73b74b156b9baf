"""The emulator's prefill/decode roles: vLLM's two-stage kv_transfer_params over real HTTP."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from emulator.clock import EmulatedClock
from emulator.command import add_arguments, options_from_args
from emulator.engine_model import EngineConfig, EngineModel
from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from emulator.pd import Handoffs, Link
from kvgate.contract.states import Role

WORDS = " ".join(f"def f{i}(x): return x + {i}" for i in range(600))  # ~6,000 tokens
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with Fleet(EmulatorOptions(instances=2, time_scale=0,
                                     roles=("prefill", "decode"))) as f:
        yield f


async def post(http: aiohttp.ClientSession, engine: str, body: dict[str, Any]
               ) -> tuple[int, dict[str, Any]]:
    async with http.post(f"http://{engine}/v1/completions", json=body) as reply:
        return reply.status, await reply.json()


async def stats(http: aiohttp.ClientSession, engine: str) -> dict[str, Any]:
    async with http.get(f"http://{engine}/admin/stats") as reply:
        found: dict[str, Any] = await reply.json()
        return found


async def two_stage(http: aiohttp.ClientSession, prefill: str, decode: str,
                    prompt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    client = {"model": "Qwen/Qwen2.5-32B-Instruct", "prompt": prompt, "max_tokens": 8}
    status, first = await post(http, prefill, {**client, "max_tokens": 1, "stream": False,
                                               "kv_transfer_params": PREFILL_PARAMS})
    assert status == 200, first
    status, answer = await post(http, decode, {**client,
                                               "kv_transfer_params": first["kv_transfer_params"]})
    assert status == 200, answer
    return first, answer


async def test_a_prefill_hands_its_blocks_to_the_decode_engine(fleet: Fleet) -> None:
    prefill, decode = fleet.engines
    assert fleet.server(prefill).pd.role is Role.PREFILL
    async with aiohttp.ClientSession() as http:
        first, answer = await two_stage(http, prefill, decode, WORDS)
        params = first["kv_transfer_params"]
        # NixlConnectorScheduler.request_finished's fields, and where to pull from.
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_engine_id"] == prefill
        assert f"{params['remote_host']}:{params['remote_port']}" == prefill
        assert len(params["remote_block_ids"]) == first["usage"]["prompt_tokens"] // 16
        assert first["usage"]["completion_tokens"] == 1
        usage = answer["usage"]
        assert usage["completion_tokens"] == 8
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]
        held = await stats(http, prefill)
        assert held["role"] == "prefill"
        assert held["kv_transfer"]["held"] == 0 and held["kv_transfer"]["pulled"] == 1
        pulled = (await stats(http, decode))["kv_transfer"]
        assert pulled["pulled_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]

        # A second pull of the same blocks finds them gone: the decode engine computes the
        # prompt (here: from its own cache, which holds it since the first turn).
        status, again = await post(http, decode, {
            "model": "Qwen/Qwen2.5-32B-Instruct", "prompt": WORDS, "max_tokens": 2,
            "kv_transfer_params": params})
        assert status == 200 and again["usage"]["completion_tokens"] == 2
        assert (await stats(http, decode))["kv_transfer"]["failed_pulls"] == 1


async def test_the_decode_engine_pulls_only_what_it_lacks(fleet: Fleet) -> None:
    prefill, decode = fleet.engines
    async with aiohttp.ClientSession() as http:
        _, turn1 = await two_stage(http, prefill, decode, WORDS)
        before = (await stats(http, decode))["kv_transfer"]["pulled_tokens"]
        longer = WORDS + " " + " ".join(f"g{i} = {i}" for i in range(300))
        _, turn2 = await two_stage(http, prefill, decode, longer)
        pulled = (await stats(http, decode))["kv_transfer"]["pulled_tokens"] - before
        cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"]
        lacking = turn2["usage"]["prompt_tokens"] - turn1["usage"]["prompt_tokens"]
        assert 0 < pulled <= lacking + 16  # the new turn's blocks, not the whole prompt again
        assert cached >= 0.9 * turn2["usage"]["prompt_tokens"]


async def test_a_streamed_decode_reports_the_prompt_cached(fleet: Fleet) -> None:
    prefill, decode = fleet.engines
    async with aiohttp.ClientSession() as http:
        body = {"model": "Qwen/Qwen2.5-32B-Instruct", "prompt": WORDS, "max_tokens": 1,
                "stream": False, "kv_transfer_params": PREFILL_PARAMS}
        _, first = await post(http, prefill, body)
        stream = {"model": "Qwen/Qwen2.5-32B-Instruct", "prompt": WORDS, "max_tokens": 4,
                  "stream": True, "stream_options": {"include_usage": True},
                  "kv_transfer_params": first["kv_transfer_params"]}
        async with http.post(f"http://{decode}/v1/completions", json=stream) as reply:
            events = [line[6:] for line in (await reply.text()).splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        usage = json.loads(events[-1])["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]


class _Clock(EmulatedClock):
    def __init__(self) -> None:
        super().__init__(0)
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_held_blocks_expire_after_vllms_timeout_and_are_unpinned() -> None:
    clock = _Clock()
    model = EngineModel(EngineConfig(hbm_tokens=64 * 16, block_size=16))
    handoffs = Handoffs(model, clock)
    assert handoffs.timeout_s == 480.0  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default
    kept = handoffs.hold([1, 2, 3])
    pulled = handoffs.hold([4, 5])
    assert handoffs.pull(pulled) == 2 and handoffs.pull(pulled) is None
    clock.t = 479.0
    handoffs.expire()
    assert len(handoffs) == 1
    clock.t = 480.0
    assert handoffs.pull(kept) is None and handoffs.expired == 1 and len(handoffs) == 0
    assert model.cache.usage() == 0.0  # nothing pinned any more


def test_the_link_is_priced_like_a_ddr_link() -> None:
    link = Link(gbps=20.0, fixed_ms=3.0, kv_bytes_per_token=256 * 1024)
    # 10,000 tokens x 256 KiB = 2.62 GB at 20 GB/s: 131 ms, plus the fixed 3 ms.
    assert link.seconds(10_000) == pytest.approx(0.003 + 10_000 * 262_144 / 20e9)
    assert link.seconds(0) == 0.0


def test_roles_on_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--instances", "3", "--roles", "prefill,decode,both"])
    assert options_from_args(args).roles == ("prefill", "decode", "both")
    every = options_from_args(parser.parse_args(["--instances", "2", "--role", "decode"]))
    assert every.roles == ("decode", "decode") and every.role(1) is Role.DECODE
    with pytest.raises(ValueError, match="one role per instance"):
        options_from_args(parser.parse_args(["--instances", "3", "--roles", "prefill,decode"])
                          ).validate()
    with pytest.raises(SystemExit):
        parser.parse_args(["--roles", "prefill,encode"])
