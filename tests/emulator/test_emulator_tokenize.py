"""vLLM's `POST /tokenize` and `POST /detokenize` on a running instance, over HTTP: vLLM's
request and response shapes, and the very ids the instance counts and caches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from emulator.fleet import Fleet
from emulator.options import DEFAULT_MAX_MODEL_LEN, EmulatorOptions
from emulator.tokenize import DEFAULT_VOCAB_SIZE

MODEL = "Qwen/Qwen2.5-32B-Instruct"
PROMPT = "".join(f"def handler_{i}(request):\n    return route(request, pool={i})\n"
                 for i in range(40))
MESSAGES = [{"role": "system", "content": "You are a code assistant."},
            {"role": "user", "content": "Explain:\n" + PROMPT}]


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    async with Fleet(EmulatorOptions(instances=1, time_scale=0, no_ddr_pool=True)) as fleet:
        yield fleet.engines[0]


async def post(engine: str, path: str, body: object) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://{engine}{path}", json=body) as reply:
            return reply.status, await reply.json()


async def test_tokenize_a_prompt_gives_the_ids_the_engine_counts_and_caches(engine: str) -> None:
    status, got = await post(engine, "/tokenize", {"model": MODEL, "prompt": PROMPT,
                                                   "add_special_tokens": True})
    assert status == 200, got
    assert set(got) == {"count", "max_model_len", "tokens", "token_strs"}
    assert got["count"] == len(got["tokens"]) > 100
    assert got["max_model_len"] == DEFAULT_MAX_MODEL_LEN and got["token_strs"] is None
    assert all(0 <= t < DEFAULT_VOCAB_SIZE for t in got["tokens"])
    async with AsyncOpenAI(base_url=f"http://{engine}/v1", api_key="-", max_retries=0) as c:
        by_text = await c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        by_ids = await c.completions.create(model=MODEL, prompt=got["tokens"], max_tokens=2)
    assert by_text.usage is not None and by_ids.usage is not None
    assert by_text.usage.prompt_tokens == got["count"] == by_ids.usage.prompt_tokens
    # The ids hit the blocks the text request cached: they are the same tokens.
    assert by_ids.usage.prompt_tokens_details is not None
    assert by_ids.usage.prompt_tokens_details.cached_tokens == (got["count"] - 1) // 16 * 16


async def test_tokenize_a_chat_counts_what_a_chat_completion_counts(engine: str) -> None:
    status, chat = await post(engine, "/tokenize", {"messages": MESSAGES})  # no model: served
    assert status == 200, chat
    async with AsyncOpenAI(base_url=f"http://{engine}/v1", api_key="-", max_retries=0) as c:
        done = await c.chat.completions.create(model=MODEL, messages=MESSAGES,  # type: ignore[arg-type]
                                               max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens == chat["count"]
    _, bare = await post(engine, "/tokenize", {"messages": MESSAGES,
                                               "add_generation_prompt": False})
    _, open_ = await post(engine, "/tokenize", {"messages": MESSAGES,
                                                "add_generation_prompt": False,
                                                "continue_final_message": True})
    # Without the assistant's opening marker, a prefix; left open, shorter still.
    assert chat["tokens"][:bare["count"]] == bare["tokens"] and bare["count"] < chat["count"]
    assert bare["tokens"][:open_["count"]] == open_["tokens"] and open_["count"] < bare["count"]


async def test_token_strings_and_detokenize_give_the_text_back(engine: str) -> None:
    _, got = await post(engine, "/tokenize", {"prompt": PROMPT, "return_token_strs": True})
    assert len(got["token_strs"]) == got["count"] and "".join(got["token_strs"]) == PROMPT
    status, back = await post(engine, "/detokenize", {"model": MODEL, "tokens": got["tokens"]})
    assert status == 200 and back == {"prompt": PROMPT}
    # An id this engine never produced has no text: a visible stand-in, not a guess.
    unseen = next(t for t in range(DEFAULT_VOCAB_SIZE) if t not in set(got["tokens"]))
    _, odd = await post(engine, "/detokenize", {"tokens": [got["tokens"][0], unseen]})
    assert odd["prompt"] == got["token_strs"][0] + f"<|{unseen}|>"
    assert (await post(engine, "/detokenize", {"tokens": []}))[1] == {"prompt": ""}


@pytest.mark.parametrize(("path", "body", "status", "param", "words"), [
    ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model", "does not exist"),
    ("/tokenize", {}, 400, None, "either 'prompt'"),
    ("/tokenize", {"prompt": "x", "messages": []}, 400, "prompt", "either 'prompt'"),
    ("/tokenize", {"prompt": ["x"]}, 400, "prompt", "must be a string"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens",
     "boolean"),
    ("/tokenize", {"messages": "hi"}, 400, "messages", "list of message objects"),
    ("/tokenize", {"messages": [{"content": "x"}]}, 400, "messages", "role"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}],
                   "add_generation_prompt": True, "continue_final_message": True},
     400, "continue_final_message", "Cannot set both"),
    ("/detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model", "does not exist"),
    ("/detokenize", {"tokens": [1, -2]}, 400, "tokens", "non-negative integer"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens", "non-negative integer"),
    ("/detokenize", {"tokens": [DEFAULT_VOCAB_SIZE]}, 400, "tokens", "out of vocabulary"),
    ("/detokenize", [1, 2], 400, None, "JSON object"),
])
async def test_bad_requests_get_vllm_shaped_errors(
        engine: str, path: str, body: object, status: int, param: str | None, words: str) -> None:
    got_status, got = await post(engine, path, body)
    assert got_status == status, got
    assert got["error"]["code"] == status and got["error"]["param"] == param
    assert words in got["error"]["message"]


async def test_a_body_that_is_not_json_is_refused(engine: str) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/tokenize", "/detokenize"):
            async with http.post(f"http://{engine}{path}", data=b"{nope") as reply:
                assert reply.status == 400
                assert "not valid JSON" in (await reply.json())["error"]["message"]
