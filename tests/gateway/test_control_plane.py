"""The control plane run as users run it: reloads, `kvgate status`, a leader dying."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import yaml

from kvgate.config.dump import to_dict
from kvgate.config.model import HostPort
from kvgate.etcd import EtcdClient
from kvgate.runtime.children.child import Child
from stack.local import grpc_serving
from tests.support.polling import eventually, homes_of
from tests.support.ports import free_ports
from tests.support.stack import gateway_config, running_stack


async def _status(admin: str) -> dict:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", "status", "--json", "--admin", admin,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def _envoy_hosts(http: httpx.AsyncClient, admin: str) -> set[str]:
    text = (await http.get(f"http://{admin}/clusters")).text
    return {line.split("::")[1] for line in text.splitlines()
            if line.startswith("kvgate_pool_coder::") and line.count("::") >= 3
            and line.split("::")[2] == "cx_active"}


async def test_reload_adds_and_removes_engines_and_rejects_bad_files(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    a, b, c = await upstreams(3)
    config = gateway_config([a.address, b.address], prefix=prefix)
    async with running_stack(config, tmp_path) as stack:
        path = stack.workdir / "kvgate.effective.yaml"
        admin = str(stack.config.control_plane.admin)
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            sessions = [f"r-{i}" for i in range(16)]
            before = await homes_of(http, sessions)
            assert await _envoy_hosts(http, str(config.envoy_admin)) == {a.address, b.address}
            data = yaml.safe_load(path.read_text())
            data["pools"][0]["endpoints"].append({"address": c.address, "kv_pool": "kv-a"})
            path.write_text(yaml.safe_dump(data))
            await eventually(lambda: _envoy_hosts(http, str(config.envoy_admin)),
                             until=lambda hosts: hosts == {a.address, b.address, c.address},
                             what="Envoy's pool after adding an engine")
            assert await homes_of(http, sessions) == before  # adding moves nobody
            newcomers = await homes_of(http, [f"n-{i}" for i in range(30)])
            assert c.address in newcomers.values()

            data["pools"][0]["endpoints"] = [e for e in data["pools"][0]["endpoints"]
                                             if not (isinstance(e, dict)
                                                     and e["address"] == c.address)]
            path.write_text(yaml.safe_dump(data))
            await eventually(lambda: _envoy_hosts(http, str(config.envoy_admin)),
                             until=lambda hosts: hosts == {a.address, b.address},
                             what="Envoy's pool after removing an engine")
            assert await homes_of(http, sessions) == before  # sessions on other engines stay
            moved = await homes_of(http, [s for s, h in newcomers.items() if h == c.address])
            assert c.address not in moved.values()

            path.write_text("pools: [{name: coder, endpoints: [10.0.0.1:99999]}]\n")
            status = await eventually(lambda: _status(admin),
                                      until=lambda status: bool(status["last_reload_error"]),
                                      what="the bad file's reload error in `kvgate status`")
            assert "port must be 1..65535" in status["last_reload_error"]
            assert await _envoy_hosts(http, str(config.envoy_admin)) == {a.address, b.address}
            assert await homes_of(http, sessions) == before
            assert len(status["nodes"]) == 1 and status["nodes"][0]["nacks"] == 0
            assert {e["address"]: e["state"] for e in status["endpoints"]} == {
                a.address: "active", b.address: "active"
            }
            assert status["leader"] == status["identity"]


async def test_leader_killed_follower_takes_over_and_traffic_never_stops(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    ups = await upstreams(3)
    config = gateway_config([u.address for u in ups], prefix=prefix)
    async with running_stack(config, tmp_path / "stack") as stack:
        second_config = to_dict(stack.config)
        admin_port, xds_port = free_ports(2)
        second_admin = HostPort("127.0.0.1", admin_port)
        second_config["control_plane"] = {"xds": f"127.0.0.1:{xds_port}",
                                          "admin": str(second_admin)}
        path = tmp_path / "second.yaml"
        path.write_text(yaml.safe_dump(second_config))
        second = Child("control-plane-2", [
            sys.executable, "-m", "control_plane", "-c", str(path), "--identity", "second",
        ], tmp_path / "second.log")
        await second.start()
        try:
            await second.wait_ready(lambda: grpc_serving(second_admin), 30)
            client = EtcdClient(stack.etcd_endpoints)
            leader_key = f"{prefix}leader".encode()
            try:
                first_leader = (await client.get(leader_key)).value.decode()  # type: ignore[union-attr]
                assert first_leader != "second"  # the stack's replica started first
                errors: list[int] = []
                stop = asyncio.Event()
                sent = 0

                async def traffic() -> None:
                    nonlocal sent
                    gateway = f"http://{config.listener}"
                    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http:
                        while not stop.is_set():
                            reply = await http.get("/v1/chat",
                                                   headers={"x-session-id": f"t-{sent % 10}"})
                            sent += 1
                            if reply.status_code != 200:
                                errors.append(reply.status_code)

                runner = asyncio.create_task(traffic())
                assert stack.control_plane is not None
                stack.control_plane.kill()
                # How soon is the leader lease's TTL (3 s) plus the follower's check: a design
                # figure, not something a busy machine's wall clock can confirm.
                await eventually(lambda: client.get(leader_key),
                                 until=lambda holder: holder is not None
                                 and holder.value == b"second",
                                 what="the follower holding the leader key")
                at_takeover = sent
                await eventually(lambda: sent >= at_takeover + 50,  # flowing under the new leader
                                 what="50 more requests after the takeover")
                stop.set()
                await runner
            finally:
                await client.close()
            assert errors == []
            status = await _status(str(second_admin))
            assert status["leader"] == "second" and status["identity"] == "second"
        finally:
            await second.stop()
