"""A stock OpenAI client through the real gateway to emulated vLLM engines: `prompt_cache_key`
keeps a conversation on one engine (cached tokens grow turn by turn), and so does sending
nothing at all (the implicit key), while other conversations go elsewhere."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.support.fleet import EngineProcesses
from tests.support.stack import gateway_config, running_stack

CODE = "def handler(event):\n    return event\n" * 150


async def _conversation(client: openai.AsyncOpenAI, model: str, topic: str,
                        **extra: object) -> tuple[set[str], list[tuple[int, int]]]:
    """Five turns; the engines that served them, and (cached, prompt) tokens per turn."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a coding assistant.\n" + CODE},
        {"role": "user", "content": f"About {topic}: what does this code do?"},
    ]
    engines, tokens = set(), []
    for turn in range(5):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=24, **extra  # type: ignore[arg-type]
        )
        completion = raw.parse()
        engines.add(raw.headers["x-engine-id"])
        details = completion.usage.prompt_tokens_details  # type: ignore[union-attr]
        tokens.append((details.cached_tokens if details else 0,
                       completion.usage.prompt_tokens))  # type: ignore[union-attr]
        messages += [{"role": "assistant", "content": completion.choices[0].message.content or ""},
                     {"role": "user", "content": f"Turn {turn}: and then?"}]
    return engines, tokens


async def test_openai_client_sessions_from_the_body(tmp_path: Path, prefix: str) -> None:
    fleet = EngineProcesses(4, tmp_path / "fleet")
    await fleet.start()
    try:
        config = gateway_config(fleet.engines, prefix=prefix)
        async with running_stack(config, tmp_path / "stack"):
            client = openai.AsyncOpenAI(base_url=f"http://{config.listener}/v1",
                                        api_key="unused", max_retries=0)
            model = (await client.models.list()).data[0].id

            engines, tokens = await _conversation(client, model, "keys",
                                                  prompt_cache_key="dev-42-conversation-7")
            assert len(engines) == 1
            cached = [hit for hit, _ in tokens]
            assert cached[0] < cached[1] < cached[2] < cached[3] < cached[4], tokens
            assert all(hit >= 0.9 * (total - 64) for hit, total in tokens[1:]), tokens

            # Streaming is untouched: the same key streams its answer from the same engine.
            raw = await client.chat.completions.with_raw_response.create(
                model=model, max_tokens=16, stream=True,
                stream_options={"include_usage": True}, prompt_cache_key="dev-42-conversation-7",
                messages=[{"role": "system", "content": "You are a coding assistant.\n" + CODE},
                          {"role": "user", "content": "About keys: what does this code do?"}],
            )
            assert {raw.headers["x-engine-id"]} == engines
            chunks = [chunk async for chunk in raw.parse()]
            assert sum(1 for c in chunks if c.choices) >= 2
            assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0

            homes = set()
            for topic in range(8):  # no id at all: one engine per conversation, spread
                engines, tokens = await _conversation(client, model, f"topic {topic}")
                assert len(engines) == 1, (topic, engines)
                assert tokens[-1][0] > tokens[1][0] > 0
                homes |= engines
            assert len(homes) >= 2
            await client.close()
    finally:
        await fleet.stop()
