"""Sessions in the request body, read by the real Envoy (json_to_metadata) and handed to ext_proc
as metadata: body keys stick, the header wins, odd bodies are routed without a session."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import gateway_config, running_stack

# The body is read inside Envoy on both of ext_proc's transports; every test runs on both.
pytestmark = pytest.mark.parametrize("transport", ["grpc", "http"])


def _counter(metrics_text: str, family_name: str, label: str) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == family_name:
            return {s.labels[label]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError(f"no {family_name} metric")


class Gateway:
    def __init__(self, http: httpx.AsyncClient, metrics_url: str) -> None:
        self.http = http
        self.metrics_url = metrics_url

    async def home(self, body: dict[str, object] | None = None, **kwargs: object) -> str:
        if body is not None:
            kwargs["json"] = body
        reply = await self.http.post("/v1/chat/completions", **kwargs)  # type: ignore[arg-type]
        assert reply.status_code == 200, reply.text
        return str(reply.json()["upstream"])

    async def sources(self) -> dict[str, float]:
        text = (await self.http.get(self.metrics_url)).text
        return _counter(text, "kvgate_ext_proc_session_sources", "source")

    async def decisions(self) -> dict[str, float]:
        text = (await self.http.get(self.metrics_url)).text
        return _counter(text, "kvgate_ext_proc_decisions", "outcome")


def _chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], **fields}


async def test_body_fields_stick_and_the_header_wins(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(4)
    config = gateway_config([u.address for u in ups], prefix=prefix, transport=transport)
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}") as http:
            gateway = Gateway(http, f"http://{config.ext_proc.metrics}/metrics")
            before = await gateway.sources()

            by_key = {}
            for i in range(12):  # OpenAI's field: every turn of one key on one engine
                homes = {await gateway.home(_chat(prompt_cache_key=f"conv-{i}")) for _ in range(3)}
                assert len(homes) == 1, homes
                by_key[i] = homes.pop()
            assert len(set(by_key.values())) >= 2  # and different keys spread

            for i in range(6):  # `user`, and LiteLLM's metadata.session_id (a dotted path)
                user = {await gateway.home(_chat(user=f"user-{i}")) for _ in range(3)}
                litellm = {await gateway.home(_chat(metadata={"session_id": f"ll-{i}"}))
                           for _ in range(3)}
                assert len(user) == 1 and len(litellm) == 1

            # The same id is the same session wherever it travels.
            assert await gateway.home(headers={"x-session-id": "conv-3"}) == by_key[3]

            # Header beats body: a request carrying both goes where the header's session is.
            header_homes = {i: await gateway.home(headers={"x-session-id": f"hdr-{i}"})
                            for i in range(12)}
            both = {i: await gateway.home(_chat(prompt_cache_key=f"conv-{i}"),
                                          headers={"x-session-id": f"hdr-{i}"})
                    for i in range(12)}
            assert both == header_homes
            assert both != by_key  # (the body keys alone live elsewhere for some of them)

            # prompt_cache_key wins over user (the configured order), a number is its text.
            first = await gateway.home(_chat(prompt_cache_key="conv-5", user="someone"))
            assert first == by_key[5]
            assert await gateway.home(_chat(prompt_cache_key=77)) == await gateway.home(
                headers={"x-session-id": "77"})

            after = await gateway.sources()
            assert after["body"] - before["body"] == 12 * 3 + 6 * 6 + 2
            assert after["header"] - before["header"] == 1 + 12 + 12 + 1
            assert after["none"] == before["none"]
            # Every body reached its upstream (the 14 header-only requests had none).
            sizes = [size for u in ups for size in u.seen_body_sizes]
            assert sum(1 for size in sizes if size == 0) == 14


async def test_odd_bodies_are_routed_without_a_session(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(3)
    config = gateway_config([u.address for u in ups], prefix=prefix, transport=transport,
                            session={"body_limit": "64KiB", "implicit": "off"})
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}") as http:
            gateway = Gateway(http, f"http://{config.ext_proc.metrics}/metrics")
            before = await gateway.decisions()
            key = {"prompt_cache_key": "odd-1"}
            json_type = {"content-type": "application/json"}

            oversized = json.dumps(_chat(padding="x" * 200_000, **key)).encode()
            chunked = json.dumps(_chat(**key)).encode()

            async def chunks():  # no Content-Length: the client does not say the size
                yield chunked[:10]
                yield chunked[10:]

            sent = [
                (b"{not json", json_type),
                (b"", json_type),
                (b'"just a string"', json_type),
                (json.dumps(_chat(**key)).encode(), {"content-type": "text/plain"}),
                (oversized, json_type),
            ]
            for content, headers in sent:
                await gateway.home(content=content, headers=headers)
            # A chunked body is held whole by the gateway's body-size limit (max_request_bytes),
            # which then states its length: it is read like any other.
            chunked_home = await gateway.home(content=chunks(), headers=json_type)
            reply = await http.get("/v1/models")
            assert reply.status_code == 200

            after = await gateway.decisions()
            assert after["sessionless"] - before["sessionless"] == len(sent) + 1
            assert after["new"] - before["new"] == 1
            assert after["error"] == before["error"]
            sizes = sorted(size for u in ups for size in u.seen_body_sizes)
            assert len(oversized) in sizes  # passed through whole, unread

            # The same key in a JSON body within the limit is the same session.
            assert {await gateway.home(_chat(**key)) for _ in range(3)} == {chunked_home}
            assert (await gateway.decisions())["new"] == after["new"]


def _conversation(question: str, turns: int = 4) -> list[dict[str, object]]:
    system = {"role": "system", "content": "You are a code assistant for the bank. " * 30}
    messages: list[dict[str, object]] = [system, {"role": "user", "content": question}]
    bodies = []
    for turn in range(turns):
        bodies.append({"model": "m", "messages": list(messages), "stream": True})
        messages += [{"role": "assistant", "content": f"Answer {turn}. " * 20},
                     {"role": "user", "content": f"And then {turn}?"}]
    return bodies


async def test_conversations_without_an_id_stick_and_spread(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(4)
    config = gateway_config([u.address for u in ups], prefix=prefix, transport=transport)
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}") as http:
            gateway = Gateway(http, f"http://{config.ext_proc.metrics}/metrics")
            before = await gateway.sources()
            homes = []
            for i in range(16):  # one system prompt, sixteen conversations, four turns each
                turns = _conversation(f"Question {i}: why does build {i} fail?")
                landed = {await gateway.home(body) for body in turns}
                assert len(landed) == 1, (i, landed)
                homes.append(landed.pop())
            assert len(set(homes)) >= 3, homes
            after = await gateway.sources()
            assert after["implicit"] - before["implicit"] == 16 * 4
            assert after["none"] == before["none"]


async def test_implicit_off_leaves_such_requests_sessionless(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(2)
    config = gateway_config([u.address for u in ups], prefix=prefix, transport=transport,
                            session={"implicit": "off", "body_fields": []})
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}") as http:
            gateway = Gateway(http, f"http://{config.ext_proc.metrics}/metrics")
            before = await gateway.sources()
            for body in _conversation("Why?"):
                await gateway.home({**body, "prompt_cache_key": "not read"})
            after = await gateway.sources()
            assert after["none"] - before["none"] == 4
            assert after["implicit"] == before["implicit"] and after["body"] == before["body"]
