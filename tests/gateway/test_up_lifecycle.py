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

from kvgate.config.dump import to_dict
from kvgate.runtime.children.ports import port_in_use
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.stack import gateway_config
from tests.support.up_children import running, running_up, write_config


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
    path = write_config(tmp_path / "kvgate.yaml", to_dict(config))
    temp = tmp_path / "tmp"  # where kvgate up makes its work directories
    temp.mkdir()
    env = {"TMPDIR": str(temp)}

    # 1. Killed with SIGKILL: nothing can run in kvgate up, yet every child stops.
    async with running_up("-c", str(path), env=env) as (first, output):
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]
        assert len(pids) == 4, output  # etcd, control plane, ext_proc, Envoy
        ports = _ports(output)
        assert (config.listener.host, config.listener.port) in ports and len(ports) >= 6
        await first.kill()
    await eventually(lambda: not any(running(pid) for pid in pids), 30)
    await eventually(lambda: not any(port_in_use(h, p) for h, p in ports), 30)
    (left,) = temp.glob("kvgate-up-*")  # a killed run cannot remove its work directory

    # 2. The next run removes it; at ready it names the engine that fails its health check.
    async with running_up("-c", str(path), env=env) as (second, output):
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

        # 3. The terminal closes: SIGHUP stops everything cleanly (status 0).
        rest = await second.finish(signal.SIGHUP)
    assert "kvgate up: stopped" in rest and f"work directory removed: {workdir}" in rest
    assert [pid for pid in pids if running(pid)] == []
    assert list(temp.glob("kvgate-up-*")) == []
    assert not token_file.exists()


async def test_ready_is_not_said_when_no_engine_answers(tmp_path: Path, prefix: str) -> None:
    engines = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    config = gateway_config(engines, prefix=prefix)
    path = write_config(tmp_path / "kvgate.yaml", to_dict(config))
    async with running_up("-c", str(path), env={"TMPDIR": str(tmp_path)}) as (up, output):
        await up.finish(signal.SIGTERM)  # status 0
    assert "kvgate is ready" not in output
    assert "kvgate is up, but no engine passes its health check" in output
    assert "WARNING: 2 of 2 engines fail their health check:" in output
    assert all(engine in output for engine in engines)
