"""`kvgate bench --session-in header|body|none` and `--header NAME:VALUE`: where each request
carries its session, and the extra headers, as a stand-in gateway sees them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from bench_helpers import gateway_answering, small_bank, streamed_answer

from bench.client import DriveOptions, drive
from kvgate_cli.main import main

SCALE = 0.01


async def _seen(session_in: str, extra: tuple[tuple[str, str], ...] = ()
                ) -> list[tuple[dict[str, str], dict[str, object]]]:
    seen: list[tuple[dict[str, str], dict[str, object]]] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        seen.append(({k.lower(): v for k, v in request.headers.items()}, await request.json()))
        return await streamed_answer(request)

    workload = small_bank(sessions=3, duration_s=30)
    async with gateway_answering(complete) as url:
        result = await drive(workload, DriveOptions(url, SCALE, session_in=session_in,
                                                    extra_headers=extra))
    assert result.stats.errors == 0 and len(seen) == len(workload.requests)
    sessions = sorted(r.session for r in workload.requests)
    assert sorted(str(headers.get("x-session-id", body.get("prompt_cache_key")))
                  for headers, body in seen) == (sessions if session_in != "none"
                                                 else ["None"] * len(sessions))
    return seen


async def test_the_session_goes_where_session_in_says() -> None:
    for headers, body in await _seen("header"):
        assert "x-session-id" in headers and "prompt_cache_key" not in body
    for headers, body in await _seen("body", (("authorization", "Bearer t"), ("x-team", "a:b"))):
        assert "x-session-id" not in headers and body["prompt_cache_key"]
        assert headers["authorization"] == "Bearer t" and headers["x-team"] == "a:b"
    for headers, body in await _seen("none"):
        assert "x-session-id" not in headers and "prompt_cache_key" not in body


@pytest.mark.parametrize(("bad", "says"), [
    ("Authorization Bearer sk-secret", "found no ':'"),
    (":sk-secret", "the NAME before ':' is empty"),
    ("two words:sk-secret", "'two words' is not a valid header name"),
])
def test_a_bad_header_flag_is_named_without_its_value(
        bad: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--gateway", "http://127.0.0.1:1", "--header", bad])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "--header" in err
    assert "sk-secret" not in err  # a malformed flag may still be someone's API key


def test_session_in_choices_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--gateway", "http://127.0.0.1:1", "--session-in", "cookie"])
    assert "--session-in: invalid choice: 'cookie'" in capsys.readouterr().err


async def test_the_bench_command_records_where_the_session_was(tmp_path: Path) -> None:
    async def complete(request: web.Request) -> web.StreamResponse:
        assert "prompt_cache_key" in await request.json()
        assert request.headers["x-a"] == "1"
        return await streamed_answer(request)

    async with gateway_answering(complete) as url:
        args = ["bench", "--gateway", url, "--sessions", "2", "--duration-s", "20",
                "--time-scale", str(SCALE), "--session-in", "body", "--header", "x-a:1",
                "--out", str(tmp_path), "--quiet"]
        assert await asyncio.to_thread(main, args) == 0
    document = json.loads((tmp_path / "bench-bank-coding.json").read_text())
    assert document["workload"]["session_in"] == "body"
    assert document["modes"]["gateway"]["errors"] == 0
