"""`kvgate up`'s work directory: removed at the end unless kept or found there; a killed run's
removed by the next run, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate_cli.up import workdir as workdirs


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)  # reaped by run(): gone


def test_left_behind_directories(tmp_path: Path) -> None:
    killed = tmp_path / "kvgate-up-killed"
    running = tmp_path / "kvgate-up-running"
    kept = tmp_path / "kvgate-up-kept"  # --keep-workdir: no pid file
    other = tmp_path / "not-kvgate"
    for folder in (killed, running, kept, other):
        folder.mkdir()
        (folder / "etcd.log").write_text("x")
    (killed / workdirs.PID_FILE).write_text(f"{_dead_pid()}\n")
    (running / workdirs.PID_FILE).write_text(f"{os.getpid()}\n")
    (other / workdirs.PID_FILE).write_text(f"{_dead_pid()}\n")
    assert workdirs.remove_left_behind(tmp_path) == [killed]
    assert not killed.exists() and running.exists() and kept.exists() and other.exists()


def test_made_is_removed_kept_or_found_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    made, removed = workdirs.prepare(None)
    assert removed == [] and made.created and made.path.parent == tmp_path
    assert (made.path / workdirs.PID_FILE).read_text().strip() == str(os.getpid())
    assert workdirs.finish(made, keep=False) == f"work directory removed: {made.path}"
    assert not made.path.exists()

    kept, _ = workdirs.prepare(None)
    assert "kept (--keep-workdir)" in workdirs.finish(kept, keep=True)
    assert kept.path.exists() and not (kept.path / workdirs.PID_FILE).exists()
    assert workdirs.remove_left_behind(tmp_path) == []  # a kept one stays kept

    given = tmp_path / "mine"
    given.mkdir()
    found, _ = workdirs.prepare(str(given))
    assert not found.created
    assert "kept (it existed before)" in workdirs.finish(found, keep=False)
    assert given.exists()
    new, _ = workdirs.prepare(str(tmp_path / "new" / "w"))
    assert new.created
    workdirs.finish(new, keep=False)
    assert not (tmp_path / "new" / "w").exists()


def test_a_failed_run_keeps_its_work_directory(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    early, _ = workdirs.prepare(None)  # failed before any child wrote a log
    assert workdirs.finish(early, keep=False, failed=True).startswith("work directory removed")
    failed, _ = workdirs.prepare(None)
    (failed.path / "envoy.log").write_text("bind: address already in use\n")
    said = workdirs.finish(failed, keep=False, failed=True)
    assert said == f"work directory kept (something failed: the logs are there): {failed.path}"
    assert failed.path.exists() and not (failed.path / workdirs.PID_FILE).exists()
    assert workdirs.remove_left_behind(tmp_path) == []  # never cleaned up by a later run
