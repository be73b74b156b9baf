"""`kvgate up`'s lifecycle as users meet it: killed outright, its children die with it and free
every port; a closed terminal (SIGHUP) stops it cleanly; its work directory goes with it (a
killed run's by the next run); at ready it names engines that fail their health check; its
operator token is found by its user's CLI and by no one else's."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import yaml

from kvgate.config.dump import to_dict
from kvgate.runtime.children.ports import port_in_use
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.stack import gateway_config


def _alive(pid: int) -> bool:
    """Running: not gone and not a zombie (a dead child nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _read_until(stream: asyncio.StreamReader, pattern: str, within: float) -> str:
    seen = ""
    deadline = asyncio.get_running_loop().time() + within
    while pattern not in seen:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, f"no {pattern!r} in:\n{seen}"
        line = await asyncio.wait_for(stream.readline(), remaining)
        assert line, f"output ended before {pattern!r}:\n{seen}"
        seen += line.decode()
    return seen


async def _up(path: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", "up", "-c", str(path),
        env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", *args, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, output.decode()


def _ports(output: str) -> list[tuple[str, int]]:
    """Every host:port the children said they listen on (etcd's free ports included)."""
    return [(h, int(p)) for h, p in re.findall(r"(?:http|grpc)://(127\.0\.0\.1):(\d+)", output)]


async def test_killed_up_leaves_nothing_and_sighup_stops_cleanly(
    tmp_path: Path, upstreams, prefix: str, private_runtime_dir: Path,
) -> None:
    ups = await upstreams(1)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    config = gateway_config([ups[0].address, dead], prefix=prefix)
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(to_dict(config)))
    temp = tmp_path / "tmp"  # where kvgate up makes its work directories
    temp.mkdir()
    env = {"TMPDIR": str(temp)}

    # 1. Killed with SIGKILL: nothing can run in kvgate up, yet every child stops.
    first = await _up(path, env)
    try:
        assert first.stdout is not None
        output = await _read_until(first.stdout, "Ctrl-C stops everything", 60)
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
        assert len(pids) == 4, output  # etcd, control plane, ext_proc, Envoy
        ports = _ports(output)
        assert (config.listener.host, config.listener.port) in ports and len(ports) >= 6
        first.kill()
        await first.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    await eventually(lambda: not any(_alive(pid) for pid in pids), 30)
    await eventually(lambda: not any(port_in_use(h, p) for h, p in ports), 30)
    (left,) = temp.glob("kvgate-up-*")  # a killed run cannot remove its work directory

    # 2. The next run removes it; at ready it names the engine that fails its health check.
    second = await _up(path, env)
    try:
        assert second.stdout is not None
        output = await _read_until(second.stdout, "Ctrl-C stops everything", 60)
        assert "removed 1 work directories of runs that were killed" in output
        assert not left.exists()
        assert "kvgate is ready" in output
        assert "WARNING: 1 of 2 engines fail their health check:" in output
        assert re.search(rf"{re.escape(dead)}  cannot connect", output), output
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
        (workdir,) = temp.glob("kvgate-up-*")

        # Its operator token: this user's CLI finds it; a process without it only reads.
        admin = config.control_plane.admin
        token_file = private_runtime_dir / "kvgate" / f"operator-token-{admin.port}"
        assert f"operator token (drain, undrain, fail, move): {token_file}" in output
        code, said = await _cli("endpoints", "drain", ups[0].address, "--admin", str(admin), env={})
        assert code == 0, said
        stranger = {"XDG_RUNTIME_DIR": str(tmp_path), "KVGATE_ADMIN_TOKEN": ""}
        code, said = await _cli("endpoints", "undrain", ups[0].address, "--admin", str(admin),
                                env=stranger)
        assert code == 1 and "needs the operator token" in said, said
        code, said = await _cli("status", "--admin", str(admin), env=stranger)
        assert code == 0 and "draining" in said, said

        # 3. The terminal closes: SIGHUP stops everything cleanly.
        second.send_signal(signal.SIGHUP)
        rest = (await asyncio.wait_for(second.stdout.read(), 30)).decode()
        assert await second.wait() == 0, rest
    finally:
        if second.returncode is None:
            second.kill()
            await second.wait()
    assert "kvgate up: stopped" in rest and f"work directory removed: {workdir}" in rest
    assert [pid for pid in pids if _alive(pid)] == []
    assert list(temp.glob("kvgate-up-*")) == []
    assert not token_file.exists()


async def test_ready_is_not_said_when_no_engine_answers(tmp_path: Path, prefix: str) -> None:
    engines = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    config = gateway_config(engines, prefix=prefix)
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(to_dict(config)))
    process = await _up(path, {"TMPDIR": str(tmp_path)})
    try:
        assert process.stdout is not None
        output = await _read_until(process.stdout, "Ctrl-C stops everything", 60)
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stdout.read(), 30)).decode()
        assert await process.wait() == 0, rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert "kvgate is ready" not in output
    assert "kvgate is up, but no engine passes its health check" in output
    assert "WARNING: 2 of 2 engines fail their health check:" in output
    assert all(engine in output for engine in engines)
