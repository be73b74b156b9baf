"""The gateway's cheap behaviours on both of ext_proc's transports, one stack per transport.

Each test here leaves the stack as it found it (its own session names, counters read as
deltas), so a transport's tests share one real stack (etcd, control plane, ext_proc, Envoy):
two pools, so the pool header has something to forge; two ext_proc replicas, each on its own
port in Envoy's ext_proc cluster (how replicas per host share the cores); a load factor
generous enough that every first placement is exactly Envoy's ring pick, so whatever falls
back to Envoy's ring (a slow or stalled ext_proc) still lands at home; a message timeout short
enough to test in a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config import Config, load_text
from kvgate.config.dump import to_dict
from kvgate.contract.envoy import POOL_HEADER
from kvgate.etcd import EtcdClient
from kvgate.placement import EnvoyRing, session_hash
from kvgate.session import normalize_session
from stack.local import Stack
from tests.admin.admin_helpers import run_cli
from tests.support.polling import eventually, homes_of
from tests.support.stack import gateway_config, running_stack
from tests.support.upstreams import Upstream

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGE_TIMEOUT_S = 1.0
# Counted on both transports when ext_proc's answer did not come in time (over gRPC,
# message_timeouts too; over HTTP the http_service's own timeout, the same value, may fire
# first and count as a 504 instead).
GAVE_UP = "http.kvgate.ext_proc.kvgate.failure_mode_allowed"


@dataclass
class Gateway:
    transport: str
    stack: Stack
    config: Config
    prefix: str
    coder: list[Upstream]
    chat: list[Upstream]

    @property
    def url(self) -> str:
        return f"http://{self.config.listener}"

    async def decisions_per_replica(self, http: httpx.AsyncClient) -> list[dict[str, float]]:
        """Each replica's decisions so far, by outcome (from its own metrics port)."""
        return [_decisions((await http.get(f"http://{metrics}/metrics")).text)
                for metrics in self.stack.ext_proc_metrics]

    async def decisions(self, http: httpx.AsyncClient) -> dict[str, float]:
        """Every replica's decisions so far, by outcome."""
        total: dict[str, float] = {}
        for replica in await self.decisions_per_replica(http):
            for outcome, count in replica.items():
                total[outcome] = total.get(outcome, 0.0) + count
        return total

    async def envoy_gave_up(self, http: httpx.AsyncClient) -> int:
        """Requests Envoy sent on without ext_proc's answer (its message timeout passed)."""
        stats = (await http.get(f"http://{self.config.envoy_admin}/stats")).text
        return _envoy_counter(stats, GAVE_UP)

    async def bindings(self) -> dict[str, str]:
        """pool/session → endpoint, as stored in etcd."""
        client = EtcdClient(self.stack.etcd_endpoints)
        try:
            kvs, _ = await client.get_prefix(f"{self.prefix}bindings/".encode())
        finally:
            await client.close()
        return {kv.key.decode().split("/bindings/", 1)[1]: json.loads(kv.value)["endpoint"]
                for kv in kvs}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["grpc", "http"])
async def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    transport: str = request.param
    coder, chat = [Upstream() for _ in range(4)], [Upstream() for _ in range(2)]
    try:
        for upstream in (*coder, *chat):
            await upstream.start()
        prefix = f"/kvgate/test-{uuid.uuid4().hex[:8]}/"
        data = to_dict(gateway_config([u.address for u in coder], prefix=prefix,
                                      load_factor=10.0, transport=transport, ext_procs=2,
                                      message_timeout=f"{MESSAGE_TIMEOUT_S:g}s"))
        data["pools"].append({**data["pools"][0], "name": "chat",
                              "endpoints": [u.address for u in chat]})
        data["routes"] = [{"match": {"prefix": "/chat/"}, "pool": "chat"},
                          {"match": {"prefix": "/"}, "pool": "coder"}]
        config = load_text(yaml.safe_dump(data))
        async with running_stack(config, tmp_path_factory.mktemp(transport)) as stack:
            yield Gateway(transport, stack, config, prefix, coder, chat)
    finally:
        for upstream in (*coder, *chat):
            await upstream.stop()


async def test_a_client_sent_pool_header_is_ignored_and_never_reaches_an_engine(
    gateway: Gateway,
) -> None:
    # (gRPC carries the pool as stream metadata no client can reach; HTTP in a route-set header.)
    sessions = {f"coder-{i}": ("/v1/x", "chat") for i in range(6)}
    sessions |= {f"chat-{i}": ("/chat/x", "coder") for i in range(6)}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for session, (path, forged) in sessions.items():
            reply = await http.get(path, headers={"x-session-id": session, POOL_HEADER: forged})
            assert reply.status_code == 200, reply.text
    ours = {normalize_session(s.encode()): s for s in sessions}
    bound = {key for key in await gateway.bindings() if key.split("/", 1)[1] in ours}
    # Each session bound in its route's pool (with two pools and no pool known, ext_proc would
    # bind nothing; with the forged one, the other pool).
    assert bound == {f"{s.split('-')[0]}/{u}" for u, s in ours.items()}
    for upstream in [*gateway.coder, *gateway.chat]:
        for headers in upstream.seen_headers:
            assert POOL_HEADER not in headers


async def test_client_destination_header_is_ignored_and_stripped(gateway: Gateway) -> None:
    config = gateway.config
    served_before = sum(u.requests for u in gateway.coder)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        first = await http.get("/v1/x", headers={"x-session-id": "pinned"})
        home = first.json()["upstream"]
        others = [u.address for u in gateway.coder if u.address != home]
        targets = [*others, str(config.envoy_admin), "127.0.0.1:1"]
        for target in targets:
            reply = await http.get("/v1/x", headers={
                "x-session-id": "pinned", "x-gateway-destination-endpoint": target})
            assert reply.status_code == 200
            assert reply.json()["upstream"] == home
        # Sessionless requests with the header are not steered either: spread stays random.
        admin = {"x-gateway-destination-endpoint": str(config.envoy_admin)}
        sessionless = await asyncio.gather(*(http.get("/v1/y", headers=admin) for _ in range(10)))
        assert all(r.status_code == 200 and "upstream" in r.json() for r in sessionless)
    for upstream in [*gateway.coder, *gateway.chat]:
        for headers in upstream.seen_headers:
            assert "x-gateway-destination-endpoint" not in headers
    assert sum(u.requests for u in gateway.coder) - served_before == 1 + len(targets) + 10


def _decisions(metrics_text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "kvgate_ext_proc_decisions":
            return {
                s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")
            }
    raise AssertionError("no decisions metric")


async def test_odd_session_ids_and_the_decision_metrics(gateway: Gateway) -> None:
    big = ("x" * 8192).encode()
    non_utf8 = b"sess-\xff\xfe\x80-end"
    some_uuid = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        async def route(value: bytes | None) -> str:
            headers = {} if value is None else {"x-session-id": value}
            reply = await http.get("/v1/chat", headers=headers)
            assert reply.status_code == 200, reply.text
            return reply.json()["upstream"]

        gave_up_before = await gateway.envoy_gave_up(http)
        before = await gateway.decisions(http)
        for value in (b"", None):  # (a blank value cannot be sent: h11 refuses it)
            await route(value)
        after_sessionless = await gateway.decisions(http)

        for value in (big, non_utf8):
            home = await route(value)
            assert {await route(value) for _ in range(5)} == {home}

        lower = str(some_uuid).encode()
        upper = str(some_uuid).upper().encode()
        home = await route(upper)
        assert await route(lower) == home
        assert await route(b"{" + lower + b"}") == home

        final = await gateway.decisions(http)
        gave_up = await gateway.envoy_gave_up(http) - gave_up_before
    # Exact, unless Envoy stopped waiting for a decision (its 1 s message timeout, on a machine
    # saturated for that long): then the request went on Envoy's ring, to the same engine, and
    # its decision was cancelled (`abandoned`) or never started.
    counted = {o: final[o] - before[o] for o in final}
    assert counted["error"] == 0, counted
    assert counted["abandoned"] <= gave_up, (counted, gave_up)
    assert 2 - gave_up <= after_sessionless["sessionless"] - before["sessionless"] <= 2
    if gave_up == 0:  # big, non-UTF-8 and the UUID were new; the UUID's other spellings sticky
        assert (counted["new"], counted["sticky"]) == (3, 2 * 5 + 2), counted
    else:
        assert 15 - gave_up <= counted["new"] + counted["sticky"] <= 15, (counted, gave_up)


async def test_two_replicas_each_decide_a_fair_share(gateway: Gateway) -> None:
    """Envoy spreads decisions over the replicas' ports per request (HTTP: round robin) or per
    session (gRPC: a ring over the session header), not per connection: with a few long-lived
    connections, SO_REUSEPORT could send all to one."""
    sessions = [f"share-{i}" for i in range(60)]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        await homes_of(http, sessions)  # placed: what follows is the hot path
        before = await gateway.decisions_per_replica(http)
        for _ in range(3):
            await homes_of(http, sessions)
        after = await gateway.decisions_per_replica(http)
    decided = [sum(a.values()) - sum(b.values()) for a, b in zip(after, before, strict=True)]
    assert sum(decided) == 3 * len(sessions)
    # Round robin alternates exactly; 60 sessions on a ring put a share of 30 ± 4 on each, and
    # 25 % is four deviations off (or a health check's reshuffle).
    assert min(decided) >= 0.25 * sum(decided), decided


async def test_a_session_is_decided_by_one_replica_over_grpc(gateway: Gateway) -> None:
    """Over gRPC every turn of a session reaches the same replica (while it is healthy),
    wherever its id is (a header, a body field, the implicit key): the replica that moved a
    session decides its next turn, whatever etcd's watch lag. Envoy's HTTP service has no such
    hashing: there the turns alternate between the replicas."""
    turns = 10
    chat = [{"role": "user", "content": "the same question " * 20}]
    requests: list[dict[str, Any]] = [
        *({"headers": {"x-session-id": f"one-replica-{i}"}} for i in range(4)),
        *({"json": {"model": "m", "prompt_cache_key": f"body-{i}", "messages": chat}}
          for i in range(4)),
        *({"json": {"model": "m", "messages": [
            {"role": "system", "content": f"You review repository {i}. " * 20}, *chat]}}
          for i in range(4)),
    ]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for request in requests:
            before = await gateway.decisions_per_replica(http)
            for _ in range(turns):
                reply = await http.post("/v1/chat/completions", **request)
                assert reply.status_code == 200, reply.text
            after = await gateway.decisions_per_replica(http)
            decided = sorted(sum(a.values()) - sum(b.values())
                             for a, b in zip(after, before, strict=True))
            assert decided == ([0, turns] if gateway.transport == "grpc"
                               else [turns // 2, turns // 2]), (request, decided)


async def test_envoy_checks_each_replica_every_quarter_second(gateway: Gateway) -> None:
    """A replica that steps aside (cut from etcd, or stopping) must stop getting decisions
    within a few hundred ms. Without `no_traffic_interval` set, Envoy 1.40 checked the ext_proc
    replicas once at start and then at its default of 60 s, whatever the traffic: two checks in
    all over a chaos run (its ext_proc streams do not count as the cluster's traffic there)."""
    async def attempts() -> int:
        async with httpx.AsyncClient(timeout=5) as http:
            reply = await http.get(f"http://{gateway.config.envoy_admin}/stats",
                                   params={"filter": "^cluster.kvgate_ext_proc.health_check"
                                                     ".attempt$"})
        return int(reply.text.rsplit(":", 1)[1])

    first = await attempts()
    # Two replicas, a check each every 0.25 s: 8 a second; 12 more within 10 s is a generous
    # floor on a busy machine, and unreachable at one check a minute.
    await eventually(attempts, 10, until=lambda n: n >= first + 12,
                     what="Envoy's health checks of the ext_proc replicas")


async def test_the_admin_view_shows_what_the_gateway_routed(gateway: Gateway) -> None:
    admin = str(gateway.config.control_plane.admin)
    sessions = [f"admin-view-{i}" for i in range(8)]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        homes = await homes_of(http, sessions)
    # The replica reports its bindings every few seconds: wait for one that counts ours.
    stored = await gateway.bindings()

    async def status() -> dict:
        found = await run_cli("status", "--json", admin=admin)
        assert found.code == 0, found.err
        return json.loads(found.out)

    shown = await eventually(status, every=0.5, until=lambda s: len(s["ext_procs"]) == 2
                             and all(e["bindings"] >= len(stored) for e in s["ext_procs"]),
                             what="both ext_proc replicas reporting every binding")
    assert [e["degraded"] for e in shown["ext_procs"]] == [False, False]
    per_endpoint = {e["address"]: e["sessions"] for e in shown["endpoints"] if e["pool"] == "coder"}
    in_etcd = [endpoint for key, endpoint in stored.items() if key.startswith("coder/")]
    assert per_endpoint == {u.address: in_etcd.count(u.address) for u in gateway.coder}
    listed = await run_cli("sessions", "list", "--json", admin=admin)
    assert listed.code == 0, listed.err
    ours = {normalize_session(s.encode()): home for s, home in homes.items()}
    assert {b["session"]: b["endpoint"] for b in json.loads(listed.out)
            if b["session"] in ours} == ours
    session, home = next(iter(homes.items()))  # found by the name the client sent
    found = await run_cli("sessions", "show", session, "--json", admin=admin)
    assert found.code == 0, found.err
    assert [(b["pool"], b["endpoint"]) for b in json.loads(found.out)] == [("coder", home)]


def _envoy_counter(stats: str, name: str) -> int:
    for line in stats.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise AssertionError(f"no Envoy stat {name}")


async def test_a_stalled_ext_proc_times_out_onto_the_same_ring_and_recovers(
    gateway: Gateway,
) -> None:
    """Last on purpose: it freezes the stack's ext_procs (and waits until it decides again)."""
    ring = EnvoyRing([(u.address, 1) for u in gateway.coder])
    known = [f"stall-known-{i}" for i in range(6)]
    fresh = [f"stall-fresh-{i}" for i in range(6)]
    stats_url = f"http://{gateway.config.envoy_admin}/stats"
    pids = [child.pid for child in gateway.stack.ext_procs]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        homes = await homes_of(http, known)
        assert all(homes[s] == ring.pick(session_hash(s.encode())) for s in known)
        gave_up_before = await gateway.envoy_gave_up(http)
        decided_before = await gateway.decisions(http)
        for pid in pids:  # alive, connections open, answering nothing
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            stalled = await asyncio.gather(*(
                http.get("/v1/chat", headers={"x-session-id": s}) for s in known + fresh))
            stats = (await http.get(stats_url)).text
        finally:
            for pid in pids:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)
        assert all(r.status_code == 200 for r in stalled), [r.text for r in stalled]
        landed = dict(zip(known + fresh, (r.json()["upstream"] for r in stalled), strict=True))
        # Known sessions stayed home and new ones went where Envoy's ring puts them, which is
        # where ext_proc will place them too.
        assert {s: landed[s] for s in known} == homes
        assert all(landed[s] == ring.pick(session_hash(s.encode())) for s in fresh)
        # Each request waited for its message timeout, then went on without an answer.
        assert _envoy_counter(stats, GAVE_UP) - gave_up_before == len(known + fresh), [
            line for line in stats.splitlines() if ".ext_proc.kvgate." in line]

        async def decided_round() -> tuple[dict[str, str], float]:
            """Where the fresh sessions land now, and how many decisions that took."""
            before = sum((await gateway.decisions(http)).values())
            found = await homes_of(http, fresh)
            after = sum((await gateway.decisions(http)).values())
            return found, after - before

        # Thawed, ext_proc decides every request again (its health check and any ejection
        # recover on their own), and the fresh sessions stay where the ring put them.
        await eventually(decided_round, until=lambda r: r[0] == {s: landed[s] for s in fresh}
                         and r[1] >= len(fresh), what="ext_proc deciding again after the stall")
        final = await gateway.decisions(http)
    assert final["error"] == decided_before["error"]
