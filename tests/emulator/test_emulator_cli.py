"""`kvgate emulate` and `python -m emulator` as real processes: ready file, serving, SIGTERM."""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from emulator.command import add_arguments, options_from_args
from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from tests.support.polling import eventually_sync
from tests.support.ports import free_ports

# The checkout root, so the children import this tree's `emulator` whatever the caller's cwd.
ROOT = Path(__file__).resolve().parents[2]

ENTRY_POINTS = {
    "kvgate": [sys.executable, "-m", "kvgate_cli", "emulate"],
    "module": [sys.executable, "-m", "emulator"],
}


def wait_for_file(path: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    def written() -> bool:
        if proc.poll() is not None:
            said = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise AssertionError(f"emulator exited early: {proc.returncode}\n{said}")
        return path.exists()

    eventually_sync(written, what="the ready file")
    return json.loads(path.read_text())


def port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(10)
        return s.connect_ex((host, int(port))) == 0


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_cli_serves_writes_ready_file_and_stops_on_sigterm(tmp_path: Path, entry: str) -> None:
    ready = tmp_path / "ready.json"
    cmd = [*ENTRY_POINTS[entry], "--instances", "2", "--port", "0", "--time-scale", "0",
           "--hbm-tokens", "10000", "--pool-connector", "lmcache",
           "--ready-file", str(ready)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        info = wait_for_file(ready, proc)
        assert info["pid"] == proc.pid
        assert len(info["engines"]) == 2 and info["pool_url"].startswith("http://127.0.0.1:")
        engine = info["engines"][0]
        # 800 tokens: whole 256-token chunks, which is all LMCache stores
        body = json.dumps({"prompt": "hello " * 400, "max_tokens": 2}).encode()
        req = urllib.request.Request(
            f"http://{engine}/v1/completions", data=body,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.headers["x-engine-id"] == engine
            assert json.loads(resp.read())["usage"]["completion_tokens"] == 2
        with urllib.request.urlopen(f"{info['pool_url']}/v1/stats", timeout=30) as resp:
            stats = json.loads(resp.read())
            assert stats["blocks"] > 0 and stats["connector"] == "lmcache"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert f"http://{engine}" in out.decode()
    # Logs are JSON lines on stderr.
    events = [json.loads(line)["event"] for line in err.decode().splitlines() if line.strip()]
    assert "fleet_ready" in events and "fleet_stopping" in events
    for address in [*info["engines"], info["pool_url"].removeprefix("http://")]:
        assert not port_open(address)


def test_cli_rejects_bad_options() -> None:
    proc = subprocess.run(
        [*ENTRY_POINTS["module"], "--instances", "0"], cwd=ROOT, capture_output=True, timeout=30
    )
    assert proc.returncode == 2 and b"instances" in proc.stderr


def test_time_scale_accepts_fractions() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--time-scale", "1/60"]).time_scale == pytest.approx(1 / 60)
    assert parser.parse_args(["--time-scale", "0"]).time_scale == 0
    for bad in ("-1", "1/0", "fast"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--time-scale", bad])


async def test_ports_puts_each_instance_on_its_own_port() -> None:
    wanted = tuple(free_ports(3))
    async with Fleet(EmulatorOptions(instances=3, ports=wanted, time_scale=0)) as fleet:
        assert fleet.engines == [f"127.0.0.1:{p}" for p in wanted]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--instances", "2", "--ports", "8101,8107"])
    assert options_from_args(args).ports == (8101, 8107)
    with pytest.raises(SystemExit):
        parser.parse_args(["--ports", "8101,x"])
    for options, message in (
        (EmulatorOptions(instances=2, ports=(8101,)), "one port per instance (2), got 1"),
        (EmulatorOptions(instances=2, ports=(8101, 8101)), "ports must be distinct"),
        (EmulatorOptions(instances=1, ports=(70000,)), "ports must be 1..65535"),
        (EmulatorOptions(instances=1, port=8100, ports=(8101,)), "port and ports exclude"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            options.validate()
