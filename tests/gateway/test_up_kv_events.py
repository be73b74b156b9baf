"""`kvgate up --kv-events-port P` with the collector: each emulated engine's own KV event
stream is read (engine i publishes on P + i), so a session's residency is reported on the
engine that served it and nowhere else; and it is still reported after the control plane lost
and regained its leadership (the embedded etcd killed under it and restarted by kvgate up), and
after the control plane itself was killed and started again (it catches up from each engine's
replay socket)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import grpc
import httpx

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.runtime.children.ports import free_run
from kvgate.session import normalize_session
from tests.support.polling import eventually
from tests.support.up_children import UpProcess, came_back, write_config

SESSIONS = [f"events-{i}" for i in range(6)]


async def residency(admin: str) -> dict[tuple[str, str], int | None]:
    """(engine, session) → tokens (None: unknown), from the collector stream's first message."""
    async with grpc.aio.insecure_channel(admin) as channel:
        call = admin_pb2_grpc.AdminStub(channel).WatchFleetLoad(pb.WatchFleetLoadRequest())
        try:
            async for frame in call:
                call.cancel()
                return {(r.endpoint, r.session): None if r.unknown else int(r.tokens)
                        for r in frame.residency}
        except grpc.aio.AioRpcError as exc:
            # A control plane started again leads only once its dead self's lease expires;
            # until then it says who leads (FAILED_PRECONDITION) and collects nothing.
            if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION:
                raise
    return {}


def leaderships(log: Path) -> list[bool]:
    return [('"leading": true' in line) for line in log.read_text().splitlines()
            if '"leadership"' in line]


async def test_each_engines_own_stream_is_read_through_leadership_changes_and_restarts(
        tmp_path: Path) -> None:
    events = free_run(3)
    path = write_config(tmp_path / "kvgate.yaml", {"placement": {"load_gate": {
        "source": "collector", "refresh_s": "100ms"}}})
    workdir = tmp_path / "w"
    up = await UpProcess.start("-c", str(path), "--ports", "auto", "--emulated", "3",
                               "--time-scale", "0", "--kv-events-port", str(events),
                               "--workdir", str(workdir))
    reading = asyncio.create_task(up.read())
    try:
        await eventually(lambda: "Ctrl-C stops everything" in up.output, 90,
                         what=f"kvgate up ready:\n{up.output}")
        output = up.output
        assert f"KV events: engine i publishes on {events}+i, read by the collector" in output
        gateway = re.search(r"gateway (http://127\.0\.0\.1:\d+)", output)
        admin = re.search(r"admin API (127\.0\.0\.1:\d+)", output)
        assert gateway and admin, output
        served: dict[str, str] = {}
        keys = {s: str(normalize_session(s.encode())) for s in SESSIONS}
        async with httpx.AsyncClient(base_url=gateway.group(1), timeout=60) as http:

            async def turn(session: str, words: int) -> None:
                prompt = f"{session} says: " + "def f(x):\n    return x\n" * words
                reply = await http.post("/v1/completions", headers={"x-session-id": session},
                                        json={"prompt": prompt, "max_tokens": 4})
                assert reply.status_code == 200, reply.text
                served[session] = reply.headers["x-engine-id"]

            def each_on_its_engine(seen: dict[tuple[str, str], int | None]) -> bool:
                return all({e for (e, k), t in seen.items() if k == keys[s] and t} ==
                           {served[s]} for s in SESSIONS)

            for session in SESSIONS:
                await turn(session, 40)
            assert len(set(served.values())) >= 2, served  # else one stream would pass too
            before = await eventually(lambda: residency(admin.group(1)),
                                      until=each_on_its_engine,
                                      what=f"each session on its own engine only: {served}")

            # etcd dies: the control plane steps down, and leads again once etcd is back.
            log = workdir / "control-plane.log"
            assert leaderships(log) == [True]
            up_again = up.back.get("etcd", 0)
            os.kill(up.pids["etcd"], signal.SIGKILL)
            await eventually(lambda: came_back(up, "etcd", up_again), 30, what="etcd back")
            await eventually(lambda: leaderships(log)[-2:] == [False, True], 60,
                             what="the control plane lost and regained its leadership")
            for session in SESSIONS:  # each conversation goes on
                await turn(session, 60)

            def grown(seen: dict[tuple[str, str], int | None]) -> bool:
                return each_on_its_engine(seen) and all(
                    (seen.get((served[s], keys[s])) or 0) > (before[(served[s], keys[s])] or 0)
                    for s in SESSIONS)

            before = await eventually(lambda: residency(admin.group(1)), until=grown,
                                      what="every conversation's next turn known after the "
                                      "change")

            # The control plane dies: started again, it catches up on each engine's recent
            # past from its replay socket, and knows every conversation under way.
            up_again = up.back.get("control-plane", 0)
            os.kill(up.pids["control-plane"], signal.SIGKILL)
            await eventually(lambda: came_back(up, "control-plane", up_again), 30,
                             what="control plane back")
            for session in SESSIONS:
                await turn(session, 80)
            await eventually(lambda: residency(admin.group(1)), until=grown, within=90,
                             what="every conversation's next turn known after a restart")
            metrics = re.search(r"metrics (http://127\.0\.0\.1:\d+/metrics)", output)
            assert metrics, output

            async def known_to_ext_proc() -> float:
                page = (await http.get(metrics.group(1))).text
                return float(re.findall(r"^kvgate_ext_proc_hbm_residency_pairs (\S+)$",
                                        page, re.M)[0])

            await eventually(known_to_ext_proc, until=lambda n: n >= len(SESSIONS),
                             what="ext_proc holds every session's residency again")
    finally:
        assert await up.stop() == 0, up.output
        await reading
