"""A child process with an explicit lifecycle: start, wait until ready, stop with grace."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import structlog

log = structlog.get_logger("kvgate.runtime")


class ChildFailed(Exception):
    """A child exited or never became ready; the message says which and shows its last output."""


class Child:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = env
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:  # noqa: ASYNC230 (once, at start-up)
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env={**os.environ, **(self._env or {})},
                    start_new_session=True,  # its own group: stop() reaches its children too
                )
            except OSError as exc:
                raise ChildFailed(f"{self.name}: cannot start {self.argv[0]}: {exc}") from None

    async def wait_ready(
        self, probe: Callable[[], Awaitable[bool]], within: float, interval: float = 0.05
    ) -> None:
        """Polls `probe` until it returns True; fails fast if the child exits meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            if not self.running:
                code = None if self.process is None else self.process.returncode
                raise ChildFailed(f"{self.name} exited with code {code}\n{self.tail()}")
            try:
                if await probe():
                    return
            except Exception:  # a probe error is just "not ready yet"
                pass
            if loop.time() > deadline:
                raise ChildFailed(f"{self.name} not ready after {within:g}s\n{self.tail()}")
            await asyncio.sleep(interval)

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM to the child's process group, SIGKILL after `grace` seconds."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            log.warning("child_killed", child=self.name, after_s=grace)
            self._signal(signal.SIGKILL)
            await process.wait()
        self._signal(signal.SIGKILL)  # anything it left behind in its group

    def kill(self) -> None:
        """Abrupt death, as a crash would be (for failure tests)."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  | {line}" for line in text[-lines:])
