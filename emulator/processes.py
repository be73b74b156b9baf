"""A fleet spread over several processes (``kvgate emulate --processes N``), so the emulator's own
CPU (HTTP, JSON, tokenizing, hashing) is spread over cores instead of queueing in one event loop
and showing up as TTFT.

The process started by the user serves the first share of the instances and hosts the DDR pool;
each other process (a worker: ``python -m emulator.processes OPTIONS READY``) serves its share
and reaches the pool over HTTP. Every instance keeps its place in the whole fleet (its index, for
``{index}``, its seed and its device link to the pool). Workers die with the process that started
them (:mod:`kvgate.runtime.children.child`), and stop with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog

from emulator.options import EmulatorOptions
from kvgate.runtime.children.child import Child, ChildFailed

log = structlog.get_logger("emulator.processes")
READY_WITHIN_S = 60.0


def shares(instances: int, processes: int) -> list[range]:
    """Instance indices per process, as even as possible, the first ones one larger."""
    size, extra = divmod(instances, processes)
    out, start = [], 0
    for p in range(processes):
        end = start + size + (1 if p < extra else 0)
        out.append(range(start, end))
        start = end
    return out


def share_options(options: EmulatorOptions, share: range, pool_url: str | None) -> EmulatorOptions:
    """The options of the process serving ``share``: the first hosts the pool, sized for the
    whole fleet; the others join it (or run without one, as the fleet does)."""
    ports = options.instance_ports()
    mine = dataclasses.replace(
        options, instances=len(share), port=0, first_index=share.start, processes=1,
        ports=tuple(ports[share.start:share.stop]) if ports else (),
        roles=options.roles[share.start:share.stop],
        kv_events_port=_offset(options.kv_events_port, share.start),
        kv_events_replay_port=_offset(options.kv_events_replay_port, share.start))
    if share.start == 0:
        return dataclasses.replace(mine, ddr_tokens=options.pool_tokens)
    if options.no_ddr_pool:
        return mine
    return dataclasses.replace(mine, pool_url=pool_url, pool_fail=(), pool_slow=(), pool_port=0)


def _offset(port: int, first: int) -> int:
    """The port of instance ``first`` when the first instance's is ``port`` (0 stays off)."""
    return port + first if port else 0


def _to_json(options: EmulatorOptions) -> str:
    data = dataclasses.asdict(options)
    if data["pool_fail"] or data["pool_slow"]:
        raise ValueError("a worker never hosts the pool: its fault windows stay with the first")
    return json.dumps(data)


def _from_json(text: str) -> EmulatorOptions:
    data: dict[str, Any] = json.loads(text)
    data["ports"] = tuple(data["ports"])
    data["roles"] = tuple(data.get("roles", ()))
    data["pool_fail"] = data["pool_slow"] = ()
    return EmulatorOptions(**data)


class Workers:
    """The worker processes of one fleet: started after the first process's pool listens,
    stopped before it."""

    def __init__(self, options: EmulatorOptions, log_level: str) -> None:
        self.options = options
        self.log_level = log_level
        self.children: list[Child] = []
        self.engines: list[str] = []
        self.dir: Path | None = None

    async def start(self, pool_url: str | None) -> list[str]:
        """Start one worker per share but the first; their engines, in fleet order."""
        self.dir = Path(tempfile.mkdtemp(prefix="kvgate-emulate-"))
        parts = shares(self.options.instances, self.options.processes)
        try:
            found = await asyncio.gather(*(
                self._start_one(number, share_options(self.options, share, pool_url))
                for number, share in enumerate(parts[1:], 1)))
            self.engines = [engine for engines in found for engine in engines]
        except BaseException:
            await self.stop()
            raise
        log.info("workers_ready", processes=len(self.children) + 1, logs=str(self.dir))
        return self.engines

    async def _start_one(self, number: int, options: EmulatorOptions) -> list[str]:
        assert self.dir is not None
        spec, ready = self.dir / f"worker-{number}.json", self.dir / f"worker-{number}.ready"
        spec.write_text(_to_json(options))
        child = Child(f"emulator worker {number}",
                      [sys.executable, "-m", "emulator.processes", str(spec), str(ready),
                       self.log_level], self.dir / f"worker-{number}.log")
        self.children.append(child)
        await child.start()

        async def listening() -> bool:
            return ready.exists()

        await child.wait_ready(listening, READY_WITHIN_S)
        return list(json.loads(ready.read_text())["engines"])

    async def exited(self) -> str:
        """Returns when any worker exits, naming it (a fleet short of instances is not the fleet
        asked for)."""
        waits = {asyncio.ensure_future(c.process.wait()): c for c in self.children
                 if c.process is not None}
        if not waits:
            await asyncio.Event().wait()  # no worker: never
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in waits:
                future.cancel()
        child = waits[done.pop()]
        return f"{child.name} exited with code {child.process and child.process.returncode}"

    async def stop(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after a grace); remove their files."""
        await asyncio.gather(*(c.stop() for c in self.children), return_exceptions=True)
        self.children.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _worker(spec: Path, ready: Path, log_level: str) -> int:
    from emulator.command import configure_logging, serve  # the command module imports this one
    from kvgate.runtime.tasks.loop import run as run_loop

    configure_logging(log_level)
    return run_loop(serve(_from_json(spec.read_text()), ready, log_level))


if __name__ == "__main__":
    try:
        sys.exit(_worker(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
    except (OSError, ValueError, ChildFailed) as exc:
        sys.exit(f"emulator worker: {exc}")
