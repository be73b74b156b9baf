"""The reference pages stay references: history goes to docs/journal/."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_benchmarks_reference_stays_within_500_lines() -> None:
    lines = (DOCS / "benchmarks.md").read_text().count("\n")
    assert lines <= 500, f"docs/benchmarks.md has {lines} lines: move history to docs/journal/"


def test_each_fault_has_its_heading_with_target_result_mechanism_and_test() -> None:
    text = (DOCS / "faults.md").read_text()
    sections = text.split("\n## ")[1:]
    faults = [s for s in sections if "**Target:**" in s]
    assert len(faults) >= 10
    for section in faults:
        title = section.splitlines()[0]
        for part in ("**Done:**", "**Current result:**", "**Mechanism:**", "**Test:**"):
            assert part in section, f"faults.md, {title!r}: no {part}"
