"""The result tables in the docs are what docs/render_results.py renders from the committed
results in docs/results: a table edited by hand, or a result regenerated without rendering the
docs again, fails here."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def renderer() -> ModuleType:
    path = ROOT / "docs" / "render_results.py"
    spec = importlib.util.spec_from_file_location("render_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RENDER = renderer()
DOCS = [doc for doc in RENDER.documents() if not doc.is_relative_to(RENDER.RESULTS)]
WITH_BLOCKS = [doc for doc in DOCS if RENDER.BLOCK.search(doc.read_text())]


def test_the_reference_pages_have_rendered_tables() -> None:
    names = {doc.relative_to(ROOT).as_posix() for doc in WITH_BLOCKS}
    assert {"README.md", "docs/benchmarks.md", "docs/pool-profiles.md"} <= names
    blocks = RENDER.BLOCK.findall((ROOT / "docs" / "benchmarks.md").read_text())
    assert {"simulate-bank-coding", "scenarios", "plans", "real-vs-sim", "sweep"} <= set(blocks)


@pytest.mark.parametrize("doc", WITH_BLOCKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_table_is_what_the_committed_results_render(doc: Path) -> None:
    text = doc.read_text()
    rendered = RENDER.render(text)
    diff = "\n".join(difflib.unified_diff(text.splitlines(), rendered.splitlines(),
                                          "in the doc", "rendered", lineterm="", n=1))
    assert rendered == text, (f"{doc.relative_to(ROOT)} is not what `python docs/render_results.py`"
                              f" renders from docs/results:\n{diff}")


def test_a_table_edited_by_hand_is_caught() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    start = text.index("<!-- result: scenarios -->")
    row = text.index("| [simulate-bank-coding]", start)
    cell = text.index(" %", row)
    edited = text[:cell - 1] + ("0" if text[cell - 1] != "0" else "1") + text[cell:]
    assert RENDER.render(edited) == text != edited


def test_a_block_naming_no_result_is_refused() -> None:
    with pytest.raises(SystemExit, match=r"no docs/results/no-such-run\.md"):
        RENDER.render("<!-- result: no-such-run -->\n<!-- /result -->")
