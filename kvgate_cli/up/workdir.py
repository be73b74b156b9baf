"""`kvgate up`'s work directory (logs, rendered configs, the embedded etcd's data): made for the
run and removed when it ends, unless asked to keep it or it existed before.

A run killed with SIGKILL cannot remove its own: each run leaves its pid in its directory, and
the next run that makes one in the same temporary folder removes those whose run is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "kvgate-up-"
PID_FILE = "kvgate-up.pid"


@dataclass(frozen=True, slots=True)
class Workdir:
    path: Path
    created: bool  # made by this run (removed at the end unless kept)


def prepare(given: str | None) -> tuple[Workdir, list[Path]]:
    """The work directory (`--workdir`, else a new one in the temporary folder), and the
    directories of dead runs removed on the way."""
    if given is not None:
        path = Path(given)
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        return Workdir(path, created), []
    removed = remove_left_behind(Path(tempfile.gettempdir()))
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    (path / PID_FILE).write_text(f"{os.getpid()}\n")
    return Workdir(path, True), removed


def finish(workdir: Workdir, keep: bool, failed: bool = False) -> str:
    """Removes the directory unless kept, or the run failed and left logs (they say why);
    says what happened to it."""
    failed = failed and any(workdir.path.glob("*.log"))
    if keep or failed or not workdir.created:
        (workdir.path / PID_FILE).unlink(missing_ok=True)  # kept: never removed by a later run
        why = ("--keep-workdir" if keep else "something failed: the logs are there" if failed
               else "it existed before")
        return f"work directory kept ({why}): {workdir.path}"
    shutil.rmtree(workdir.path, ignore_errors=True)
    return f"work directory removed: {workdir.path}"


def remove_left_behind(folder: Path) -> list[Path]:
    """Removes this user's `kvgate-up-*` directories in `folder` whose run is no longer alive.
    One whose pid is alive (maybe reused by another program) is left alone."""
    removed = []
    for path in folder.glob(f"{PREFIX}*"):
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            pid = int((path / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # no pid file: kept on purpose, or another program's
        if not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process now
    return True
