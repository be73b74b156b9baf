"""Every repository file the Markdown names exists: a path under one of the repository's
top-level folders (`kvgate/routing/handler.py`, `bench/collector_at_scale.py`), outside fenced
code, read from the repository's root or the document's own folder. Globs and placeholders
(`docs/results/scale-N.*`) are not paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.test_docs_links import FILES, ROOT, prose_lines

TOPS = sorted(p.name for p in ROOT.iterdir()
              if p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".egg-info"))
TOP = "|".join(map(re.escape, TOPS))
PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/(?:[\w.-]+/)*[\w-]+(?:\.[a-z0-9]{{1,5}})+)(?![\w*{{])")
PLACEHOLDERS = {"docs/results/NAME.md"}  # benchmarks.md: "a NAME is a file, docs/results/NAME.md"


def missing(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for number, line in prose_lines(path.read_text()):
        for cited in PATH.findall(line):
            if cited in PLACEHOLDERS or (root / cited).exists() or (path.parent / cited).exists():
                continue
            found.append(f"{path.relative_to(root).as_posix()}:{number}: {cited}")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_file_the_docs_cite_exists(path: Path) -> None:
    assert missing(path) == []


def test_a_gone_file_is_caught(tmp_path: Path) -> None:
    (tmp_path / "kvgate").mkdir()
    (tmp_path / "kvgate" / "here.py").write_text("")
    doc = tmp_path / "a.md"
    doc.write_text("`kvgate/here.py` and (`kvgate/gone.py`), `kvgate/x-N.*`\n\n```\n"
                   "kvgate/fenced.py\n```\n")
    assert missing(doc, tmp_path) == ["a.md:1: kvgate/gone.py"]
