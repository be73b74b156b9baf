"""A huge session id through the real gateway, whole, to an emulated engine (the other odd ids,
empty, non-UTF-8, UUIDs in either case, on both transports: test_transports.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.stack import gateway_config, running_stack


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
