"""`kvgate up --roles`: an emulated prefill/decode fleet behind the whole stack, with a stock
OpenAI client: a long first turn prefilled on a prefill engine and decoded (≥ 90 % cached) on
its decode engine, the short next turn never reaching a prefill engine, `kvgate status`
showing the roles."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.support.stack import admin_json
from tests.support.up_children import ports_only, running_up

CODE = "def handler(event, context):\n    return event['body']\n" * 400  # ~6,000 tokens


async def test_up_with_prefill_and_decode_engines(tmp_path: Path) -> None:
    path = tmp_path / "ports.yaml"
    ports = ports_only(path)
    listener = ports["listener"]["port"]
    roles_given = "prefill,decode,prefill,decode"
    async with running_up("-c", str(path), "--time-scale", "0", "--roles", roles_given,
                          "--workdir", str(tmp_path / "w")) as (up, _):
        report = await admin_json(ports["control_plane"]["admin"], "status")
        roles = {e["address"]: e["role"] for e in report["endpoints"]}
        assert sorted(roles.values()) == ["decode", "decode", "prefill", "prefill"]
        prefills = [a for a, r in roles.items() if r == "prefill"]

        async with httpx.AsyncClient() as http, openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{listener}/v1", api_key="unused",
                max_retries=0) as client:
            async def requests_on_prefill_engines() -> list[int]:
                return [(await http.get(f"http://{a}/admin/stats")).json()["requests"]
                        for a in prefills]

            model = (await client.models.list()).data[0].id
            messages = [{"role": "system", "content": "You are a coding assistant.\n" + CODE},
                        {"role": "user", "content": "What does this code do?"}]
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=16,  # type: ignore[arg-type]
                extra_headers={"x-session-id": "up-pd-1"})
            first = raw.parse()
            decode = raw.headers["x-engine-id"]
            assert roles[decode] == "decode"
            usage = first.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens
            assert sum(await requests_on_prefill_engines()) == 1  # the prefill, once
            seen = await requests_on_prefill_engines()

            messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                         {"role": "user", "content": "And if the body is missing?"}]
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=8,  # type: ignore[arg-type]
                extra_headers={"x-session-id": "up-pd-1"})
            assert raw.headers["x-engine-id"] == decode
            assert await requests_on_prefill_engines() == seen  # no prefill engine asked
        await up.finish()


def test_up_refuses_roles_that_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    from kvgate_cli.main import main

    assert main(["up", "--emulated", "3", "--roles", "prefill,decode"]) == 1
    assert "--roles must name one role per emulated engine (3), got 2" in capsys.readouterr().err
    assert main(["up", "--emulated", "2", "--roles", "prefill,prefill"]) == 1
    assert "prefill engines need at least one engine that decodes" in capsys.readouterr().err
