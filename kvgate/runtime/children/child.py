"""A child process with an explicit lifecycle: start, wait until ready, stop with grace; and on
Linux it dies with its parent.

Children die with their parent: each is started through a few lines of Python that ask Linux
for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG), then exec the program in place (same
pid). So a `kvgate up` killed with SIGKILL, or a test runner that crashes, leaves no etcd, Envoy
or service behind holding its ports. Doing it in a separate exec keeps Python code out of the
window between fork and exec, where the parent's other threads (gRPC's) could deadlock it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import structlog

log = structlog.get_logger("kvgate.runtime")


class ChildFailed(Exception):
    """A child exited or never became ready; the message says which and shows its last output."""


# argv: parent pid, program, its arguments. -I -S: no environment, no site-packages: quick.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass  # not Linux: no death signal
if os.getppid() != int(sys.argv[1]):
    sys.exit(143)  # the parent died before the request took effect
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.exit(f"cannot start {sys.argv[2]}: {exc}")
"""


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv`, run so that it gets SIGTERM when this process dies (Linux)."""
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


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
        if shutil.which(self.argv[0]) is None:
            raise ChildFailed(f"{self.name}: cannot start {self.argv[0]}: not found or not "
                              "executable")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:  # noqa: ASYNC230 (once, at start-up)
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *die_with_parent(self.argv),
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
        """Polls `probe` until it returns True; fails fast if the child exits meanwhile, or if
        the probe raises ChildFailed (it will never be ready)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            if not self.running:
                code = None if self.process is None else self.process.returncode
                raise ChildFailed(f"{self.name} exited with code {code}\n{self.tail()}")
            try:
                if await probe():
                    return
            except ChildFailed:  # the probe knows it never will be
                raise
            except Exception:  # any other probe error is just "not ready yet"
                pass
            if loop.time() > deadline:
                raise ChildFailed(f"{self.name} not ready after {within:g}s\n{self.tail()}")
            await asyncio.sleep(interval)

    async def wait_exit(self, within: float | None) -> int | None:
        """Waits up to ``within`` seconds (None: as long as it takes) for the child to end on
        its own; its exit code."""
        if self.process is None:
            return None
        return await asyncio.wait_for(self.process.wait(), within)

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
