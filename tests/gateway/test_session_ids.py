"""Odd session ids through the real gateway: empty, huge, non-UTF-8, UUIDs in either case."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import gateway_config, running_stack


def _decisions(metrics_text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "kvgate_ext_proc_decisions":
            return {
                s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")
            }
    raise AssertionError("no decisions metric")


async def test_odd_session_ids(tmp_path: Path, upstreams, prefix: str) -> None:
    ups = await upstreams(4)
    config = gateway_config([u.address for u in ups], prefix=prefix)
    big = ("x" * 8192).encode()
    non_utf8 = b"sess-\xff\xfe\x80-end"
    some_uuid = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            async def route(value: bytes | None) -> str:
                headers = {} if value is None else {"x-session-id": value}
                reply = await http.get("/v1/chat", headers=headers)
                assert reply.status_code == 200, reply.text
                return reply.json()["upstream"]

            metrics_url = f"http://{config.ext_proc.metrics}/metrics"
            before = _decisions((await http.get(metrics_url)).text)
            for value in (b"", None):  # (a blank value cannot be sent: h11 refuses it)
                await route(value)
            after_sessionless = _decisions((await http.get(metrics_url)).text)
            assert after_sessionless["sessionless"] - before["sessionless"] == 2
            assert after_sessionless["error"] == before["error"]

            for value in (big, non_utf8):
                home = await route(value)
                assert {await route(value) for _ in range(5)} == {home}

            lower = str(some_uuid).encode()
            upper = str(some_uuid).upper().encode()
            home = await route(upper)
            assert await route(lower) == home
            assert await route(b"{" + lower + b"}") == home

            final = _decisions((await http.get(metrics_url)).text)
            # big, non-UTF-8 and the UUID were new; the UUID's other spellings were sticky.
            assert final["new"] - before["new"] == 3
            assert final["error"] == before["error"]


async def test_8kib_session_id_reaches_an_emulated_engine(tmp_path: Path, prefix: str) -> None:
    from tests.support.fleet import EngineProcesses

    fleet = EngineProcesses(2, tmp_path / "fleet")
    await fleet.start()
    try:
        config = gateway_config(fleet.engines, prefix=prefix)
        big = "s" * 8192
        async with running_stack(config, tmp_path / "stack"):
            async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
                homes = set()
                for _ in range(3):
                    reply = await http.post(
                        "/v1/chat/completions", headers={"x-session-id": big},
                        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                    )
                    assert reply.status_code == 200, reply.text
                    homes.add(reply.headers["x-engine-id"])
                assert len(homes) == 1
                seen = (await http.get(f"http://{homes.pop()}/admin/last-request-headers")).json()
                assert seen["headers"]["x-session-id"] == big
    finally:
        await fleet.stop()
