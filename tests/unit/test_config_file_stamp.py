"""The control plane rereads its YAML when the file changes: a file rewritten in place within
one tick of the kernel's coarse clock keeps its mtime, so the change is told by size and inode
too (a reload that read it mid-write must still see it whole)."""

from __future__ import annotations

import os
from pathlib import Path

from control_plane.service import _stamp


def test_a_rewrite_that_keeps_the_mtime_is_still_a_change(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.yaml"
    path.write_text("")  # truncated, as a reload may catch a file being rewritten
    caught = path.stat().st_mtime_ns
    before = _stamp(path)
    path.write_text("pools: [{name: p, endpoints: [10.0.0.1:8000]}]\n")
    os.utime(path, ns=(caught, caught))  # written within the same clock tick
    assert _stamp(path) != before
    assert _stamp(path) == _stamp(path)  # unchanged: no reload


def test_a_missing_file_has_no_stamp(tmp_path: Path) -> None:
    assert _stamp(tmp_path / "gone.yaml") is None
