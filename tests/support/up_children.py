"""`kvgate up` as a subprocess: started, read until it is ready, stopped by a signal. Under
traffic, its children SIGKILLed one at a time: what the supervision tests
(tests/gateway/test_up_supervision.py and the chaos tier's longer run) measure. Every request is
timed and kept; each child's pid is read from what kvgate up prints ("ready ... (pid N)" at
start, "NAME is back (pid N, ...)" after a restart)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from kvgate.session import normalize_session
from tests.support.polling import eventually
from tests.support.ports import free_ports
from tests.support.stack import stored_bindings

READY = re.compile(r"^\s+(\S+)\s+ready\s.*\(pid (\d+)\)$")
BACK = re.compile(r"^kvgate up: (\S+) is back \(pid (\d+),")
ETCD = re.compile(r"etcd\s+ready\s+http://(127\.0\.0\.1:\d+)")
ALL_READY = "Ctrl-C stops everything"  # what kvgate up prints last, once all is ready


@dataclass
class UpProcess:
    """A running `kvgate up` and what it has printed so far."""

    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)  # child → its current pid
    back: dict[str, int] = field(default_factory=dict)  # child → restarts it came back from
    etcd: str = ""

    @classmethod
    async def start(cls, *args: str, env: Mapping[str, str] | None = None) -> UpProcess:
        """`kvgate up ARGS`, with `env` added to this process's environment."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvgate_cli", "up", *args,
            env=None if env is None else {**os.environ, **env},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        return cls(process)

    async def read(self) -> None:
        """Reads its output until it ends (run as a task)."""
        while await self._line() is not None:
            pass

    async def _line(self) -> str | None:
        """Its next line of output, noted (None: the output ended)."""
        assert self.process.stdout is not None
        line = (await self.process.stdout.readline()).decode()
        if not line:
            return None
        line = line.rstrip("\n")
        self.lines.append(line)
        if ready := READY.match(line):
            self.pids[ready.group(1)] = int(ready.group(2))
        if back := BACK.match(line):
            self.pids[back.group(1)] = int(back.group(2))
            self.back[back.group(1)] = self.back.get(back.group(1), 0) + 1
        if etcd := ETCD.search(line):
            self.etcd = etcd.group(1)
        return line

    async def ready(self, within: float = 60.0) -> str:
        """Reads its output until it says all is ready; that output."""
        async def said() -> None:
            while True:
                line = await self._line()
                assert line is not None, f"output ended before {ALL_READY!r}:\n{self.output}"
                if ALL_READY in line:
                    return

        try:
            await asyncio.wait_for(said(), within)
        except TimeoutError:
            raise AssertionError(
                f"no {ALL_READY!r} within {within:g} s in:\n{self.output}") from None
        return self.output

    async def finish(self, sig: signal.Signals = signal.SIGINT, within: float = 30.0) -> str:
        """Stops it with `sig`, which must end it with status 0; what it printed since last
        read."""
        start = len(self.lines)
        self.process.send_signal(sig)
        await asyncio.wait_for(self.read(), within)
        rest = "\n".join(self.lines[start:])
        assert await self.process.wait() == 0, rest
        return rest

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
        return await self.process.wait()


@dataclass(frozen=True, slots=True)
class Request:
    started: float
    ended: float
    session: str
    upstream: str | None  # None: failed
    error: str = ""  # why it failed: the status and body, or the exception


@dataclass
class Traffic:
    """`sessions` conversations, each sending one request after another (paced), until
    stopped."""

    url: str
    sessions: list[str]
    pace_s: float = 0.1
    done: list[Request] = field(default_factory=list)
    in_flight: dict[str, float] = field(default_factory=dict)  # session → when it started
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=len(self.sessions))
        async with httpx.AsyncClient(base_url=self.url, timeout=5, limits=limits) as http:
            await asyncio.gather(*(self._session(http, s) for s in self.sessions))

    def stop(self) -> None:
        self._stop.set()

    async def _session(self, http: httpx.AsyncClient, session: str) -> None:
        loop = asyncio.get_running_loop()
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        while not self._stop.is_set():
            started = self.in_flight[session] = loop.time()
            upstream, error = None, ""
            try:
                reply = await http.post("/v1/chat/completions", json=body,
                                        headers={"x-session-id": session})
                if reply.status_code == 200:
                    upstream = reply.json()["upstream"]
                else:
                    error = f"{reply.status_code} {reply.text[:200]}"
            except httpx.HTTPError as exc:
                error = repr(exc)
            self.done.append(Request(started, loop.time(), session, upstream, error))
            del self.in_flight[session]
            try:
                await asyncio.wait_for(self._stop.wait(), self.pace_s)  # the pace, not a wait
            except TimeoutError:
                pass

    def between(self, start: float, end: float) -> list[Request]:
        return [r for r in self.done if start <= r.started < end]


@dataclass(frozen=True, slots=True)
class Killed:
    child: str
    at: float  # loop time of the SIGKILL
    back_s: float  # until kvgate up said it was back


@dataclass(frozen=True, slots=True)
class Kill:
    """What followed one kill, once the traffic has ended (every request accounted for)."""

    child: str
    requests: int  # started within the window after the kill
    failed: int
    back_s: float
    serving_s: float | None  # until the first request started after the kill that succeeded
    errors: tuple[str, ...] = ()  # the failed requests' (first few)


async def kill_in_turn(up: UpProcess, traffic: Traffic, children: list[str],
                       window_s: float) -> list[Killed]:
    """SIGKILLs each child in turn, the next one a window after; when each was back."""
    loop = asyncio.get_running_loop()
    kills = []
    for child in children:
        before = up.back.get(child, 0)
        killed_at = loop.time()
        os.kill(up.pids[child], signal.SIGKILL)
        await eventually(partial(came_back, up, child, before), 30,
                         what=f"{child} back:\n{up.output}")
        kills.append(Killed(child, killed_at, loop.time() - killed_at))
        await asyncio.sleep(max(0.0, killed_at + window_s - loop.time()))  # the window's traffic
        # Every request of the window has ended before the next kill: its fate is this kill's.
        await eventually(partial(_ended_before, traffic, killed_at + window_s), 30)
    return kills


def came_back(up: UpProcess, child: str, before: int) -> bool:
    return up.back.get(child, 0) > before


def _ended_before(traffic: Traffic, end: float) -> bool:
    return all(started >= end for started in traffic.in_flight.values())


def assess(traffic: Traffic, kills: list[Killed], window_s: float) -> list[Kill]:
    """Each kill's window, from the traffic's record (call once the traffic has stopped)."""
    assessed = []
    for kill in kills:
        window = traffic.between(kill.at, kill.at + window_s)
        served = [r.started for r in traffic.between(kill.at, float("inf")) if r.upstream]
        failed = [f"+{r.started - kill.at:.2f}s {r.error}" for r in window if r.upstream is None]
        assessed.append(Kill(kill.child, len(window), len(failed), kill.back_s,
                             min(served) - kill.at if served else None, tuple(failed[:5])))
    return assessed


async def bindings_lost(etcd: str, prefix: str, traffic: Traffic) -> list[str]:
    """Sessions whose binding etcd no longer holds, or holds to another engine than the one
    that served its last request."""
    stored = await stored_bindings([etcd], prefix)
    last = {r.session: r.upstream for r in sorted(traffic.done, key=lambda r: r.ended)
            if r.upstream}
    return [session for session, upstream in last.items()
            if stored.get(str(normalize_session(session.encode()))) != upstream]


def running(pid: int) -> bool:
    """The process runs: it is not gone and not a zombie (a dead child nobody has reaped yet,
    which kvgate up's orphaned children briefly are)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@asynccontextmanager
async def running_up(*args: str, env: Mapping[str, str] | None = None
                     ) -> AsyncIterator[tuple[UpProcess, str]]:
    """`kvgate up ARGS` (`env` added to the environment) once it said all is ready, and what it
    printed until then; killed on the way out unless it has ended (`UpProcess.finish`)."""
    up = await UpProcess.start(*args, env=env)
    try:
        yield up, await up.ready()
    finally:
        await up.kill()


def write_config(path: Path, data: dict[str, object]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def ports_only(path: Path) -> dict[str, Any]:
    """A config of nothing but free loopback ports (kvgate up's defaults for the rest), written
    to `path`."""
    listener, admin, xds, api, ext_proc, metrics = free_ports(6)
    ports: dict[str, Any] = {
        "listener": {"port": listener}, "envoy_admin": {"port": admin},
        "control_plane": {"xds": f"127.0.0.1:{xds}", "admin": f"127.0.0.1:{api}"},
        "ext_proc": {"address": f"127.0.0.1:{ext_proc}", "metrics": f"127.0.0.1:{metrics}"},
    }
    write_config(path, ports)
    return ports
