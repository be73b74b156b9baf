"""The console script works from a virtualenv that was never activated: `.venv/bin/kvgate up`
finds Envoy and etcd beside its interpreter, with no PATH and no VIRTUAL_ENV to help it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from kvgate.runtime.children.envoy import envoy_binary
from kvgate.runtime.children.etcd import etcd_binary
from kvgate.runtime.children.executables import ExecutableNotFound, find_executable
from tests.support.polling import eventually
from tests.support.ports import free_ports

BIN = Path(sys.executable).parent  # the virtualenv's bin/ (sys.executable is not resolved)


def _unactivated() -> dict[str, str]:
    """This environment as a shell that never sourced bin/activate sees it: no VIRTUAL_ENV, and
    no PATH entry that holds the venv's scripts or any other envoy or etcd."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    kept = [
        d for d in env.get("PATH", "").split(os.pathsep)
        if d and Path(d).resolve() != BIN.resolve()
        and not any(shutil.which(name, path=d) for name in ("envoy", "etcd"))
    ]
    env["PATH"] = os.pathsep.join(kept) or os.defpath
    assert shutil.which("envoy", path=env["PATH"]) is None
    assert shutil.which("etcd", path=env["PATH"]) is None
    return env


def _kvgate() -> str:
    script = BIN / "kvgate"
    assert script.is_file(), f"no {script}: install kvgate into this environment (pip install -e .)"
    return str(script)


def test_binaries_are_found_without_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    envoy = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True,
                           timeout=60, check=True)
    assert "1.40.0" in envoy.stdout
    etcd = subprocess.run([etcd_binary(), "--version"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "etcd Version: 3.5.1" in etcd.stdout


def test_a_missing_program_is_named_with_where_it_was_looked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ExecutableNotFound) as caught:
        find_executable("kvgate-no-such-program", "kvgate-no-such-wheel")
    message = str(caught.value)
    assert message.startswith("kvgate-no-such-program binary not found")
    assert "pip install kvgate-no-such-wheel" in message
    assert str(BIN) in message


async def test_up_from_an_unactivated_venv_serves_then_stops(tmp_path: Path) -> None:
    listener, admin, xds, api, ext_proc, metrics = free_ports(6)
    config = tmp_path / "ports.yaml"
    config.write_text(yaml.safe_dump({
        "listener": {"port": listener},
        "envoy_admin": {"port": admin},
        "control_plane": {"xds": f"127.0.0.1:{xds}", "admin": f"127.0.0.1:{api}"},
        "ext_proc": {"address": f"127.0.0.1:{ext_proc}", "metrics": f"127.0.0.1:{metrics}"},
    }))
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            _kvgate(), "up", "-c", str(config), "--emulated", "1", "--time-scale", "0",
            "--workdir", str(tmp_path / "w"),
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
            env=_unactivated(), cwd=tmp_path,
        )
    try:
        await eventually(lambda: "Ctrl-C stops everything" in log.read_text()
                         or process.returncode is not None, within=90)
        output = log.read_text()
        assert "Ctrl-C stops everything" in output, output
        assert "etcd" in output and "envoy" in output, output
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener}") as http:
            reply = await http.get("/v1/models", headers={"x-session-id": "unactivated"})
        assert reply.status_code == 200, reply.text
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 0, log.read_text()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert "kvgate up: stopped" in log.read_text()


async def test_bench_compare_from_an_unactivated_venv(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        _kvgate(), "bench", "--compare", "--modes", "affinity", "--engines", "2",
        "--sessions", "4", "--duration-s", "60", "--time-scale", "1/60", "--quiet",
        "--workdir", str(tmp_path / "w"),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=_unactivated(), cwd=tmp_path,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    assert re.search(r"affinity: \d+ measured requests, 0 errors", stderr.decode()), stderr
    assert "| affinity |" in stdout.decode()
