"""`python -m emulator` as a child process: the emulated engines `kvgate up` and `bench
--compare` start behind the gateway, and the calibration's direct runs (real_vllm/direct.py)
without it. The emulator writes its engines' addresses to a ready file once they listen."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from kvgate.runtime.children.child import Child


def emulator_child(instances: int, args: Sequence[str], workdir: Path,
                   port: int = 0) -> tuple[Child, Path]:
    """The child (not started; its log in `workdir`) and the ready file it will write; its
    engines on `port` and the next ones, or on free ports (0)."""
    ready = workdir / "fleet.json"
    ready.unlink(missing_ok=True)
    child = Child("engines", [
        sys.executable, "-m", "emulator", "--instances", str(instances), "--port", str(port),
        "--ready-file", str(ready), *args], workdir / "engines.log")
    return child, ready


def with_engine_ports(argv: Sequence[str], ports: Sequence[int]) -> list[str]:
    """The emulator's command line with each engine on the port it took (``--ports``) instead
    of free ones: started again, its engines keep their addresses."""
    at = list(argv).index("--port")
    return [*argv[:at], "--ports", ",".join(map(str, ports)), *argv[at + 2:]]


def written(path: Path) -> Callable[[], Awaitable[bool]]:
    """A readiness probe: the ready file exists."""
    async def probe() -> bool:
        return path.exists()  # noqa: ASYNC240 (a stat while polling for the ready file)
    return probe
