"""`kvgate emulate --processes N`: the instances spread over N processes, every one on its port
with its place in the fleet, one DDR pool for all, and every process gone when the fleet stops
(SIGTERM), when a worker dies, or when the first process is killed outright."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from emulator.options import EmulatorOptions
from emulator.processes import share_options, shares
from tests.emulator.test_emulator_cli import ROOT, port_open, wait_for_file
from tests.support.polling import eventually_sync
from tests.support.ports import free_ports

PROMPT = "def handler(request):\n    return route(request, pool=3)\n" * 40


def start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate_cli", "emulate", "--time-scale", "0", "--hbm-tokens",
         "20000", "--engine-id", "e{index}", "--ready-file", str(ready), *flags],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        return proc, wait_for_file(ready, proc)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


def workers_of(pid: int) -> set[int]:
    """Live processes whose parent is ``pid`` and that run an emulator worker."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == pid and state != "Z" and b"emulator.processes" in cmdline:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def complete(engine: str) -> tuple[str, dict[str, Any]]:
    """(x-engine-id, usage) of one completion."""
    body = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://{engine}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.headers["x-engine-id"], json.loads(reply.read())["usage"]


def stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err.decode()


def test_instances_spread_over_processes_serve_on_their_ports_and_all_stop(
        tmp_path: Path) -> None:
    ports = free_ports(5)
    proc, info = start(tmp_path, "--instances", "5", "--processes", "3",
                       "--ports", ",".join(map(str, ports)))
    try:
        assert info["engines"] == [f"127.0.0.1:{p}" for p in ports]  # in fleet order
        workers = workers_of(proc.pid)
        assert len(workers) == 2, workers
        # Each instance keeps its place in the fleet, whichever process serves it.
        for index, engine in enumerate(info["engines"]):
            engine_id, usage = complete(engine)
            assert engine_id == f"e{index}" and usage["completion_tokens"] == 2
        # One pool: what instance 0 (first process) computed, instance 4 (a worker) loads.
        with urllib.request.urlopen(f"http://{info['engines'][4]}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        hits = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("vllm:external_prefix_cache_hits_total"))
        assert hits > 0, metrics
    finally:
        code, err = stop(proc)
    assert code == 0, err
    eventually_sync(lambda: not any(alive(w) for w in workers), what="every worker gone")
    assert not any(port_open(e) for e in info["engines"])


def test_a_dead_worker_stops_the_fleet_with_an_error(tmp_path: Path) -> None:
    proc, info = start(tmp_path, "--instances", "4", "--processes", "2", "--no-ddr-pool")
    try:
        assert info["pool_url"] is None and len(info["engines"]) == 4
        (worker,) = workers_of(proc.pid)
        os.kill(worker, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        code, err = stop(proc)
    assert code == 1
    assert "worker_exited" in err and "exited with code -9" in err
    assert not any(port_open(e) for e in info["engines"])


def test_workers_die_with_a_killed_first_process(tmp_path: Path) -> None:
    proc, info = start(tmp_path, "--instances", "2", "--processes", "2")
    workers = workers_of(proc.pid)
    try:
        assert len(workers) == 1
        proc.kill()  # no chance to stop anything: Linux's parent-death signal does it
        proc.communicate(timeout=60)
        eventually_sync(lambda: not any(alive(w) for w in workers), what="the orphaned worker")
    finally:
        stop(proc)
    assert not port_open(info["engines"][1])


def test_shares_are_even_and_keep_each_instance_in_its_place() -> None:
    assert shares(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert shares(4, 4) == [range(i, i + 1) for i in range(4)]
    options = EmulatorOptions(instances=5, processes=3, port=9000, hbm_tokens=100)
    first, second = (share_options(options, s, "http://pool") for s in shares(5, 3)[:2])
    # The first hosts the pool, sized for the whole fleet; the others join it.
    assert first.pool_url is None and first.pool_tokens == options.pool_tokens == 4000
    assert (second.pool_url, second.first_index, second.ports) == ("http://pool", 2, (9002, 9003))
    assert first.ports == (9000, 9001) and first.port == second.port == 0
    no_pool = share_options(EmulatorOptions(instances=2, processes=2, no_ddr_pool=True),
                            range(1, 2), None)
    assert no_pool.no_ddr_pool and no_pool.pool_url is None


@pytest.mark.parametrize("flags", [["--instances", "2", "--processes", "3"],
                                   ["--instances", "2", "--processes", "0"]])
def test_more_processes_than_instances_is_refused(flags: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "emulator", *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "processes must be between 1 and the instances (2)" in done.stderr


async def test_the_pools_free_port_is_never_one_an_instance_will_take(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may hand the pool (port 0) a port the caller chose for an instance and
    released: the fleet takes another, instead of failing to start the instance."""
    from emulator import fleet as fleet_module
    from emulator.fleet import Fleet
    from emulator.listen import bind_socket

    mine, theirs = free_ports(2)  # this process's instance, and another process's
    handed = [mine, theirs]  # what the "kernel" hands out for port 0 first

    def kernel(host: str, port: int) -> Any:
        return bind_socket(host, handed.pop(0) if port == 0 and handed else port)

    monkeypatch.setattr(fleet_module, "bind_socket", kernel)
    fleet = Fleet(EmulatorOptions(instances=1, ports=(mine,), time_scale=0),
                  fleet_ports=(mine, theirs))
    await fleet.start()
    try:
        assert fleet.engines == [f"127.0.0.1:{mine}"]
        assert fleet.pool_url is not None
        assert int(fleet.pool_url.rsplit(":", 1)[1]) not in (mine, theirs)
    finally:
        await fleet.stop()
