"""Every session source through every path, on the real Envoy and ext_proc: body ids with any
bytes reach ext_proc (carried percent-encoded by Envoy's Lua filter, counted when they cannot
be), and with ext_proc gone Envoy's ring hashes the same key ext_proc placed the session by, so
body-keyed and id-less conversations stay where they were."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.placement import EnvoyRing, session_hash
from kvgate.session import carry_key
from tests.support.polling import eventually
from tests.support.stack import gateway_config, running_stack

JSON = {"content-type": "application/json"}
# Body ids Envoy's gRPC stream refused as metadata (LF, CR, NUL, DEL), one that is not UTF-8
# (so not JSON: Envoy's json_to_metadata refuses the body, the Lua filter reads it), a
# lone surrogate, and ids with `%` and non-ASCII text.
ODD_IDS: list[bytes] = [b'"a\\nb"', b'"a\\rb"', b'"a\\u0000b"', b'"a\\u007fb"', b'"\xff\xfe-x"',
                        b'"s\\udc80"', b'"100%"', '"用户-7"'.encode()]


def _samples(text: str, family_name: str, label: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            return {s.labels[label]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError(f"no {family_name} metric")


async def _counts(http: httpx.AsyncClient, url: str) -> tuple[dict[str, float], dict[str, float]]:
    text = (await http.get(url)).text
    return (_samples(text, "kvgate_ext_proc_session_sources", "source"),
            _samples(text, "kvgate_ext_proc_decisions", "outcome"))


def _with_id(raw_json_string: bytes, turn: int) -> bytes:
    return (b'{"model": "m", "prompt_cache_key": ' + raw_json_string +
            b', "messages": [{"role": "user", "content": "turn ' + str(turn).encode() + b'"}]}')


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_body_ids_with_any_bytes_keep_one_engine_and_are_counted(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(4)
    # Where a key leads, not the gate's moves: the engines here answer at once, so the gate's
    # booked estimates (the long uncarried ids are sessionless of known size, booked where the
    # gate sends them) can make a session's engine look busy and move it.
    config = gateway_config([u.address for u in ups], prefix=prefix, transport=transport,
                            placement={"load_gate": {"enabled": False}})
    async with running_stack(config, tmp_path):
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            metrics = f"http://{config.ext_proc.metrics}/metrics"
            sources, decisions = await _counts(http, metrics)
            for raw in ODD_IDS:
                homes = set()
                for turn in range(5):
                    reply = await http.post("/v1/chat/completions", content=_with_id(raw, turn),
                                            headers=JSON)
                    assert reply.status_code == 200, reply.text
                    homes.add(reply.json()["upstream"])
                assert len(homes) == 1, (raw, homes)
            # Past 32 KiB once encoded the id is not carried: counted, routed without a session.
            too_long = b'"' + b"\\u0001" * 12_000 + b'"'
            for turn in range(2):
                reply = await http.post("/v1/chat/completions", content=_with_id(too_long, turn),
                                        headers=JSON)
                assert reply.status_code == 200, reply.text
            # An id-less completions prompt in UTF-8 Chinese: its implicit key (the prompt's first
            # 8 KiB, cut inside a character) is ~24 KiB once carried, in the header and the gRPC
            # stream's metadata; as metadata text it failed ext_proc's whole message.
            prompt = "请解释这段代码为什么在生产环境中失败。" * 600
            wide = set()
            for turn in range(3):
                content = json.dumps({"prompt": prompt + str(turn)}, ensure_ascii=False)
                reply = await http.post("/v1/completions", content=content.encode(),
                                        headers=JSON)
                wide.add(reply.json()["upstream"])
            assert len(wide) == 1, wide
            # Only Envoy's Lua filter sets the key: a client's copy is stripped first.
            forged = await http.get("/v1/models", headers={"x-kvgate-session-key": "100%25"})
            assert forged.status_code == 200
            # The same id in a header and in the body is the same session.
            in_body = await http.post("/v1/chat/completions", content=_with_id(b'"100%"', 9),
                                      headers=JSON)
            in_header = await http.get("/v1/models", headers={"x-session-id": "100%"})
            assert in_body.json()["upstream"] == in_header.json()["upstream"]

            after_sources, after_decisions = await _counts(http, metrics)
    asked = 5 * len(ODD_IDS) + 1
    assert after_sources["body"] - sources["body"] == asked  # every one reached ext_proc
    assert after_sources["uncarried"] - sources["uncarried"] == 2
    assert after_sources["implicit"] - sources["implicit"] == 3
    assert after_decisions["new"] - decisions["new"] == len(ODD_IDS) + 1
    assert after_decisions["sticky"] - decisions["sticky"] == asked - len(ODD_IDS) + 1 + 2
    assert after_decisions["sessionless"] - decisions["sessionless"] == 2 + 1  # (+ the forged)
    assert after_decisions["error"] == decisions["error"]
    # The key is Envoy's own: it never reaches an engine.
    assert not any("x-kvgate-session-key" in seen for u in ups for seen in u.seen_headers)


def _conversation(question: str, turns: int) -> list[bytes]:
    system = {"role": "system", "content": "You are a code assistant for the bank. " * 20}
    messages: list[dict[str, object]] = [system, {"role": "user", "content": question}]
    bodies = []
    for turn in range(turns):
        bodies.append(json.dumps({"model": "m", "messages": list(messages)}, indent=1).encode())
        messages += [{"role": "assistant", "content": f"Answer {turn}."},
                     {"role": "user", "content": f"And then {turn}?"}]
    return bodies


async def test_an_ext_proc_outage_moves_no_body_or_implicit_session(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    """A generous load factor and no load gate (which places new sessions by the engines' load):
    every first placement is Envoy's ring pick for the key the Lua filter carries, the key
    Envoy's fallback hashes with ext_proc gone."""
    ups = await upstreams(4)
    config = gateway_config([u.address for u in ups], prefix=prefix, load_factor=10.0,
                            placement={"load_gate": {"enabled": False}})
    ring = EnvoyRing([(u.address, 1) for u in ups])
    body_ids = [f"conv-{i}" for i in range(8)] + ["line\nbreak", "tab\there", "nul\x00"]
    conversations = {f"q{i}": _conversation(f"Question {i}: why does build {i} fail?", 4)
                     for i in range(10)}

    def body_turn(session: str, turn: int) -> bytes:
        return _with_id(json.dumps(session).encode(), turn)

    async with running_stack(config, tmp_path) as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            async def home(content: bytes) -> str:
                reply = await http.post("/v1/chat/completions", content=content, headers=JSON)
                assert reply.status_code == 200, reply.text
                return str(reply.json()["upstream"])

            placed = {s: await home(body_turn(s, 0)) for s in body_ids}
            placed |= {q: await home(turns[0]) for q, turns in conversations.items()}
            sources, _ = await _counts(http, f"http://{config.ext_proc.metrics}/metrics")
            assert sources["body"] == len(body_ids) and sources["implicit"] == len(conversations)

            for replica in stack.ext_procs:
                replica.kill()
                await replica.process.wait()  # type: ignore[union-attr]
            after = {s: {await home(body_turn(s, t)) for t in (1, 2, 3)} for s in body_ids}
            after |= {q: {await home(body) for body in turns[1:]}
                      for q, turns in conversations.items()}
    assert after == {s: {placed[s]} for s in placed}
    assert len(set(placed.values())) >= 3  # and they were spread
    for session in body_ids:  # ext_proc placed each where Envoy's ring puts its carried key
        assert placed[session] == ring.pick(session_hash(carry_key(session.encode())))


async def test_a_session_header_that_is_not_utf8_sticks_and_logs_json(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    """Envoy copies the header into the ext_proc stream's metadata, where gRPC cannot decode
    it: one JSON warning, not a traceback per request, and the session keeps its engine."""
    ups = await upstreams(3)
    config = gateway_config([u.address for u in ups], prefix=prefix)
    async with running_stack(config, tmp_path) as stack:
        homes = set()
        for _ in range(4):
            status, upstream = await _raw_get(str(config.listener), b"x-session-id: \xff\xfe-7")
            assert status == 200
            homes.add(upstream)
        assert len(homes) == 1, homes
        log = stack.workdir / "ext_proc-0.log"
        await eventually(lambda: "grpc_metadata_not_utf8" in log.read_text())
        lines = log.read_text().splitlines()
    assert "Traceback" not in "\n".join(lines)
    assert all(isinstance(json.loads(line), dict) for line in lines)
    warned = [json.loads(line) for line in lines if "grpc_metadata_not_utf8" in line]
    assert len(warned) == 1 and warned[0]["level"] == "warning", warned  # once per 10 s


async def _raw_get(address: str, header: bytes) -> tuple[int, str]:
    """A request with a header no HTTP client library sends: (status, the engine)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\n" + header +
                 b"\r\nconnection: close\r\n\r\n")
    await writer.drain()
    reply = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["upstream"]
