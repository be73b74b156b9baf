"""`kvgate up` as users run it: a subprocess, stopped by a signal, leaving nothing behind."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from kvgate.config.dump import to_dict
from tests.support.ports import free_port
from tests.support.stack import admin_json, gateway_config
from tests.support.up_children import ports_only, running, running_up, write_config


async def test_up_serves_then_sigterm_stops_everything(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    ups = await upstreams(2)
    config = gateway_config([u.address for u in ups], prefix=prefix)
    path = write_config(tmp_path / "kvgate.yaml", to_dict(config))
    async with running_up("-c", str(path), "--workdir", str(tmp_path / "w")) as (up, output):
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
        assert len(pids) == 4, output  # etcd, control plane, ext_proc, Envoy
        assert f"http://{config.listener}" in output
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            homes = {
                (await http.get("/v1/models", headers={"x-session-id": "up-1"})).json()["upstream"]
                for _ in range(5)
            }
        assert len(homes) == 1
        rest = await up.finish(signal.SIGTERM)
    assert "stopped" in rest
    assert [pid for pid in pids if running(pid)] == []
    assert not (tmp_path / "w").exists()  # made by this run, removed with it


async def test_up_with_port_in_use_says_so_and_starts_nothing(
    tmp_path: Path, upstreams, prefix: str
) -> None:
    ups = await upstreams(1)
    config = gateway_config([u.address for u in ups], prefix=prefix)
    data = to_dict(config)
    data["listener"]["port"] = ups[0].port  # taken by the upstream itself
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(data))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", "up", "-c", str(path), "--workdir", str(tmp_path / "w"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    text = output.decode()
    assert process.returncode == 1
    assert f"port already in use: gateway listener {ups[0].address}" in text
    assert f"(held listening, by pid {os.getpid()} (" in text  # the upstream is in this process
    assert f"change it in {path}, or use --ports auto" in text
    assert "(pid" not in text  # nothing was started


async def test_up_ports_base_names_who_holds_a_port_and_never_mentions_a_yaml(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]  # the Envoy admin port of --ports taken - 1
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvgate_cli", "up", "--ports", str(taken - 1),
            "--workdir", str(tmp_path / "w"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    text = output.decode()
    assert process.returncode == 1, text
    assert f"Envoy admin 127.0.0.1:{taken} (held listening, by pid {os.getpid()} (" in text
    assert "use --ports auto, or another --ports base" in text
    assert "YAML" not in text and "(pid" not in text, text


async def test_up_with_bad_config_reports_field_path_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "pools:\n  - name: coder\n    endpoints: [127.0.0.1:8000, 127.0.0.1:99999]\n"
        f"listener: {{port: {free_port()}}}\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", "up", "-c", str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    text = output.decode()
    assert process.returncode == 1
    assert "pools[0].endpoints[1]: port must be 1..65535, got 99999" in text
    assert "nothing was started" in text


async def test_up_with_emulated_fleet_keeps_a_conversation_on_one_engine(tmp_path: Path) -> None:
    import openai

    path = tmp_path / "ports-only.yaml"
    ports = ports_only(path)
    async with running_up("-c", str(path), "--time-scale", "0",
                          "--workdir", str(tmp_path / "w"), "--keep-workdir") as (up, output):
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
        assert len(pids) == 5, output  # engines, etcd, control plane, ext_proc, Envoy
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{ports['listener']['port']}/v1", api_key="unused"
        )
        model = (await client.models.list()).data[0].id
        code = "def handler(event):\n    return event\n" * 200
        messages: list[dict[str, str]] = [
            {"role": "system", "content": "You are a coding assistant.\n" + code}
        ]
        engines, cached = set(), []
        for turn in range(10):
            messages.append({"role": "user", "content": f"Question {turn}: refactor it."})
            raw = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, extra_headers={"x-session-id": "dev-42"}
            )
            completion = raw.parse()
            engines.add(raw.headers["x-engine-id"])
            details = completion.usage.prompt_tokens_details
            cached.append((details.cached_tokens if details else 0, completion.usage.prompt_tokens))
            messages.append(
                {"role": "assistant", "content": completion.choices[0].message.content or ""}
            )
        await client.close()
        # The printed openai example (prompt_cache_key) runs, and its cache hits grow.
        script = output.split("python - <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
        example = await asyncio.create_subprocess_exec(
            sys.executable, "-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        printed = (await asyncio.wait_for(example.communicate(script.encode()), 60))[0].decode()
        assert example.returncode == 0, printed
        hits = [int(c) for c in re.findall(r"prompt tokens, (\d+) cached", printed)]
        assert len(hits) == 4 and hits[0] < hits[1] < hits[2] < hits[3], printed
        admin = ports["control_plane"]["admin"]
        assert f"kvgate status --admin {admin}" in output
        report = await admin_json(admin, "status")
        states = [e["state"] for e in report["endpoints"]]
        assert states == ["active"] * 4, report["endpoints"]
        assert len(engines) == 1
        assert cached[0][0] == 0
        assert all(hit >= 0.9 * (total - 200) for hit, total in cached[1:]), cached
        rest = await up.finish()
    assert [pid for pid in pids if running(pid)] == []
    assert f"work directory kept (--keep-workdir): {tmp_path / 'w'}" in rest
    assert (tmp_path / "w" / "control-plane.log").stat().st_size > 0


async def test_up_refuses_etcd_security_for_its_own_etcd(tmp_path: Path) -> None:
    from tests.support.secure_etcd import make_pki

    pki = make_pki(tmp_path / "pki")
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump({"etcd": {"tls": {"ca": str(pki.ca)}}}))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", "up", "-c", str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert "etcd.tls and etcd.auth are for the etcd that etcd.endpoints names" in output.decode()


async def test_up_ports_auto_avoids_taken_defaults_and_prints_the_ports_it_took(
        tmp_path: Path, upstreams) -> None:
    ups = await upstreams(2)
    path = tmp_path / "kvgate.yaml"  # no ports: the defaults (8080, 9901, ...) would be used
    path.write_text(yaml.safe_dump({"pools": [{"name": "p", "endpoints": [u.address
                                                                          for u in ups]}]}))
    import socket

    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 8080))  # the default gateway port, taken (if not already)
    except OSError:
        pass  # someone else holds it: taken either way
    try:
        async with running_up("-c", str(path), "--ports", "auto", "--upstream-header",
                              "--workdir", str(tmp_path / "w")) as (up, output):
            pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
            gateway = re.search(r"gateway http://127\.0\.0\.1:(\d+)", output)
            admin = re.search(r"admin API (127\.0\.0\.1:\d+)", output)
            assert gateway and admin, output
            assert int(gateway.group(1)) not in (8080, 9901, 18000, 18001, 9002, 9003)
            # The examples use the ports taken, and the header the stack sets.
            assert f"curl -s http://127.0.0.1:{gateway.group(1)}/v1/chat/completions" in output
            assert "grep -i x-kvgate-upstream" in output
            assert f"kvgate status --admin {admin.group(1)}" in output
            assert "x-engine-id" not in output
            gateway_url = f"http://127.0.0.1:{gateway.group(1)}"
            async with httpx.AsyncClient(base_url=gateway_url) as http:
                reply = await http.get("/v1/models", headers={"x-session-id": "up-auto"})
            assert reply.headers["x-kvgate-upstream"] == reply.json()["upstream"]
            report = await admin_json(admin.group(1), "status")
            assert len(report["endpoints"]) == 2
            await up.finish()
    finally:
        held.close()
    assert [pid for pid in pids if running(pid)] == []


def test_ports_from_a_base_are_consecutive_and_bad_values_are_refused() -> None:
    import pytest

    from kvgate.config import Config
    from kvgate_cli.up.ports import PortsError, parse_ports, with_ports

    config = with_ports(Config(), parse_ports("30000"))
    assert [config.listener.port, config.envoy_admin.port, config.control_plane.xds.port,
            config.control_plane.admin.port, config.ext_proc.metrics.port,
            config.ext_proc.addresses[0].port] == list(range(30000, 30006))
    auto = with_ports(Config(), parse_ports("auto"))
    taken = [auto.listener.port, auto.envoy_admin.port, auto.control_plane.xds.port,
             auto.control_plane.admin.port, auto.ext_proc.metrics.port]
    assert len(set(taken)) == 5
    for bad, message in (("80", "1024..65535"), ("x", "'auto' or a base port"),
                         ("65533", "past 65535")):
        with pytest.raises(PortsError, match=message):
            with_ports(Config(), parse_ports(bad))


async def test_up_spreads_emulated_engines_over_processes_and_stops_them_all(
        tmp_path: Path) -> None:
    from tests.emulator.test_emulator_processes import alive, workers_of

    args = ("--ports", "auto", "--emulated", "4", "--emulator-processes", "2",
            "--time-scale", "0", "--workdir", str(tmp_path / "w"))
    async with running_up(*args) as (up, output):
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
        workers = {w for pid in pids for w in workers_of(pid)}
        assert len(workers) == 1, output  # the engines' process and one worker
        gateway = re.search(r"gateway http://127\.0\.0\.1:(\d+)", output)
        assert gateway, output
        body = {"prompt": "def f(x):\n    return x\n" * 20, "max_tokens": 1}
        served = set()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.group(1)}") as http:
            for i in range(24):  # sessions spread over all four engines, both processes
                reply = await http.post("/v1/completions", json=body,
                                        headers={"x-session-id": f"proc-{i}"})
                assert reply.status_code == 200, reply.text
                served.add(reply.headers["x-engine-id"])
        assert len(served) == 4, served
        await up.finish()
    assert [pid for pid in [*pids, *workers] if alive(pid)] == []


def test_up_refuses_more_emulator_processes_than_engines(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvgate_cli.main import main

    assert main(["up", "--emulated", "2", "--emulator-processes", "3"]) == 1
    assert "--emulator-processes must be between 1 and --emulated (2), got 3" in (
        capsys.readouterr().err)


def test_up_passes_the_kv_events_port_to_its_emulated_fleet(
        capsys: pytest.CaptureFixture[str]) -> None:
    from emulator.command import add_arguments, options_from_args
    from kvgate_cli.main import main
    from kvgate_cli.up.command import add_arguments as up_arguments
    from kvgate_cli.up.command import emulator_args

    up = argparse.ArgumentParser()
    up_arguments(up)
    emulate = argparse.ArgumentParser()
    add_arguments(emulate)
    for given, published in ((["--kv-events-port", "7400"], 7400), ([], 0)):
        argv = emulator_args(up.parse_args(given))
        assert options_from_args(emulate.parse_args(list(argv))).kv_events_port == published
    assert main(["up", "--emulated", "4", "--kv-events-port", "65533"]) == 1
    assert "--kv-events-port out of range for 4 engines" in capsys.readouterr().err
