"""`kvgate bench --gateway URL --header NAME:VALUE / --header-file PATH`: extra headers (a gateway's
API key) reach every request the bench sends to the gateway, and no value ever appears in what
the run prints or writes: only the names are recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from bench_helpers import gateway_answering, streamed_answer

from bench.client import redact_url
from kvgate_cli.main import main

SCALE = 0.01
KEY = "sk-live-7f3a9c1e55"  # the secret that must never be printed or written
TENANT = "team-secret-42"


def _bench(url: str, out: Path, *extra: str) -> list[str]:
    return ["bench", "--gateway", url, "--sessions", "2", "--duration-s", "20",
            "--time-scale", str(SCALE), "--out", str(out), "--quiet", *extra]


async def test_a_gateway_key_reaches_every_request_and_only_names_are_recorded(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    tenants: list[str | None] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        tenants.append(request.headers.get("x-tenant"))
        return await streamed_answer(request)

    header_file = tmp_path / "headers"
    header_file.write_text(f"# the tenant\nX-Tenant: {TENANT}\n\n")
    out = tmp_path / "out"
    async with gateway_answering(complete, api_key=KEY) as url:
        args = _bench(url, out, "--header", f"Authorization:Bearer {KEY}",
                      "--header-file", str(header_file))
        assert await asyncio.to_thread(main, args) == 0
    assert tenants and set(tenants) == {TENANT}
    document = json.loads((out / "bench-bank-coding.json").read_text())
    assert document["workload"]["extra_headers"] == ["Authorization", "X-Tenant"]
    assert document["modes"]["gateway"]["errors"] == 0
    printed = capfd.readouterr()
    written = "".join(p.read_text() for p in out.iterdir() if p.suffix in (".json", ".md"))
    for text in (printed.out, printed.err, written):
        assert KEY not in text and TENANT not in text


async def test_without_the_key_the_gateway_is_refused_before_the_run(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    async with gateway_answering(streamed_answer, api_key=KEY) as url:
        assert await asyncio.to_thread(main, _bench(url, tmp_path)) == 1
        assert "/v1/models answered HTTP 401" in capfd.readouterr().err
        wrong = _bench(url, tmp_path, "--header", "Authorization:Bearer wrong-key")
        assert await asyncio.to_thread(main, wrong) == 1
        assert "wrong-key" not in "".join(capfd.readouterr())


@pytest.mark.parametrize(("flags", "says"), [
    (["--header", "x-a:1", "--header", "X-A:2"], "header X-A is given twice"),
    (["--header", "x-session-id:fixed"], "header x-session-id is the session header"),
    (["--session-in", "body", "--session-header", "x-s", "--header", "x-s:1", "--header", "x-s:2"],
     "header x-s is given twice"),
])
def test_conflicting_headers_are_refused(flags: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--gateway", "http://127.0.0.1:1", *flags]) == 2
    assert says in capsys.readouterr().err


async def test_the_session_header_may_be_extra_when_the_bench_does_not_set_it(
        tmp_path: Path) -> None:
    # --session-in body: x-session-id is free, e.g. for a gateway that wants a fixed one.
    seen: list[str | None] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("x-session-id"))
        return await streamed_answer(request)

    async with gateway_answering(complete) as url:
        args = _bench(url, tmp_path, "--session-in", "body", "--header", "x-session-id:fixed")
        assert await asyncio.to_thread(main, args) == 0
    assert seen and set(seen) == {"fixed"}


@pytest.mark.parametrize(("content", "says"), [
    ("Authorization Bearer sk-secret\n", "line 1: expected NAME: VALUE, found no ':'"),
    ("# ok\nx-a: 1\nbad name: sk-secret\n", "line 3: 'bad name' is not a valid header name"),
    (": sk-secret\n", "line 1: the NAME before ':' is empty"),
])
def test_a_bad_header_file_names_the_line_not_the_value(
        tmp_path: Path, content: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "headers"
    path.write_text(content)
    assert main(["bench", "--gateway", "http://127.0.0.1:1", "--header-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--header-file {path}, {says}" in err and "sk-secret" not in err


def test_a_missing_header_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent"
    assert main(["bench", "--gateway", "http://127.0.0.1:1", "--header-file", str(path)]) == 2
    assert f"--header-file {path}: cannot read it (FileNotFoundError)" in capsys.readouterr().err


def test_a_password_in_the_gateway_url_is_never_shown() -> None:
    assert redact_url("http://bench:pa55@gw.example:8080/x") == "http://bench:***@gw.example:8080/x"
    assert redact_url("http://gw.example:8080") == "http://gw.example:8080"
    assert redact_url("http://only-user@gw.example") == "http://only-user@gw.example"
