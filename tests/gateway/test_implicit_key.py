"""The implicit conversation key, computed by kvgate's Lua filter inside a real Envoy: the same
for every turn of a conversation, different between conversations, bounded, and absent (never
an error) for anything it does not understand."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from kvgate.config.model import Session
from tests.support.echo_envoy import echo_envoy

SYSTEM = {"role": "system", "content": "You are a careful code assistant. " * 40}


def _turns(first_question: str, turns: int = 4) -> list[list[dict[str, object]]]:
    """The messages a chat client sends at each turn: the whole conversation so far."""
    messages: list[dict[str, object]] = [SYSTEM, {"role": "user", "content": first_question}]
    sent = []
    for turn in range(turns):
        sent.append(list(messages))
        messages += [{"role": "assistant", "content": f"answer {turn} " * 30},
                     {"role": "user", "content": f"follow-up {turn}"}]
    return sent


async def test_implicit_key_cases(tmp_path: Path) -> None:
    async with echo_envoy(Session(body_limit=256 * 1024), tmp_path) as url:
        async with httpx.AsyncClient(base_url=url) as http:

            async def key(body: object = None, *, raw: bytes | None = None,
                          headers: dict[str, str] | None = None) -> str:
                content = raw if raw is not None else json.dumps(body).encode()
                reply = await http.post("/v1/chat/completions", content=content, headers={
                    "content-type": "application/json", **(headers or {})})
                assert reply.status_code == 200, reply.text
                return reply.text

            async def chat_keys(first_question: str, **extra: object) -> set[str]:
                return {await key({"model": "m", "messages": m, **extra})
                        for m in _turns(first_question)}

            # One conversation: one key for all its turns. Two: two keys, though the system
            # prompt is the same.
            (one,) = await chat_keys("Why does my parser fail on nested lists?")
            (two,) = await chat_keys("Write a unit test for the scheduler.")
            assert one.startswith("chat:") and two.startswith("chat:") and one != two
            # Other client habits: stream flags, field order, spacing, content before role.
            assert await chat_keys("Why does my parser fail on nested lists?",
                                   stream=True) == {one}
            def spaced(messages: list[dict[str, object]]) -> bytes:
                return json.dumps({"messages": messages, "model": "m"}, indent=2).encode()

            def content_first(messages: list[dict[str, object]]) -> bytes:
                return json.dumps({"model": "m", "messages": [
                    {"content": m["content"], "role": m["role"]} for m in messages]}).encode()

            for variant in (spaced, content_first):
                keys = {await key(raw=variant(m)) for m in _turns("Why?")}
                assert len(keys) == 1 and "" not in keys, keys
            # Another system prompt with the same first question: another conversation.
            other_system = {"model": "m", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Why does my parser fail on nested lists?"}]}
            assert await key(other_system) not in ("", one)

            # Quotes and "role": "user" inside strings do not confuse it.
            tricky = {"messages": [
                {"role": "system", "content": 'say {"role": "user"} and \\"role\\":\\"user\\" ]}'},
                {"role": "developer", "content": "a path ends in a backslash: C:\\"},
                {"role": "user", "content": "first"}]}
            grown = {"messages": [*tricky["messages"], {"role": "assistant", "content": "a"},
                                  {"role": "user", "content": "second"}]}
            assert (await key(tricky)) == (await key(grown)) != ""
            assert '"first"' in await key(tricky)

            # Long prompts: the key stays small and still tells apart first messages that
            # differ only at their start or only at their end.
            code = "def f(x):\n    return x  # \"quoted\"\n" * 1500  # ~60 KB
            base = {"messages": [SYSTEM, {"role": "user", "content": code + "Explain."}]}
            start = {"messages": [SYSTEM, {"role": "user", "content": "Hi. " + code + "Explain."}]}
            end = {"messages": [SYSTEM, {"role": "user", "content": code + "Refactor."}]}
            keys = {await key(base), await key(start), await key(end)}
            assert len(keys) == 3 and max(len(k) for k in keys) < 1200

            # Multimodal content lists, and the Responses API's `input` (list or text).
            parts = {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is in this image?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
            assert (await key(parts)).startswith("chat:")
            responses = {"model": "m", "input": [{"role": "user", "content": "hello"}]}
            assert (await key(responses)).startswith("chat:")
            assert (await key({"model": "m", "input": "hello"})) == 'prompt:"hello"'

            # Completions: the prompt's first 8 KiB, so a growing prompt keeps its key.
            preamble = "You complete code. " * 100  # shared by every conversation (~2 KB)
            doc_a, doc_b = "alpha " * 2000, "beta " * 2000
            a1 = await key({"model": "m", "prompt": preamble + doc_a})
            a2 = await key({"model": "m", "prompt": preamble + doc_a + " more", "max_tokens": 9})
            b1 = await key({"model": "m", "prompt": preamble + doc_b})
            assert a1 == a2 != b1 and a1.startswith("prompt:") and len(a1) <= 8192 + 7

            # Nothing to key on: no key, and the request still goes through.
            for body in ({"messages": [SYSTEM]}, {"model": "m"}, [1, 2], "text",
                         {"messages": "not a list"}, {"messages": [1, 2]}):
                assert await key(body) == "", body
            for raw in (b"{not json", b'{"messages": [{"role": "user", "content": "unterminated',
                        b"", b"{}"):
                assert await key(raw=raw) == "", raw

            # An explicit id wins: a body field (the filter sees it), a header (nothing read).
            reply = await http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "prompt_cache_key": "k1"})
            assert reply.text == "" and reply.headers["x-found-fields"] == "prompt_cache_key=k1"
            assert await key({"messages": [{"role": "user", "content": "x"}]},
                             headers={"x-session-id": "s1"}) == ""
