"""The default run leaves the serial tiers out; a run that names one goes serial."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.support.tiers import SERIAL_TIERS, selects_serial_tier

ROOT = Path(__file__).resolve().parents[2]


def default_markexpr() -> str:
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"]
    return addopts.split("-m '", 1)[1].split("'", 1)[0]


def test_the_default_run_leaves_every_serial_tier_out() -> None:
    markexpr = default_markexpr()
    assert not selects_serial_tier(markexpr)
    for tier in SERIAL_TIERS:
        assert f"not {tier}" in markexpr


@pytest.mark.parametrize("markexpr", ["chaos", "real_vllm", "open_fault", "chaos and not slow",
                                      "not real_vllm and chaos"])
def test_a_run_naming_a_serial_tier_goes_serial(markexpr: str) -> None:
    assert selects_serial_tier(markexpr)


@pytest.mark.parametrize("markexpr", ["", "not chaos", "not chaos and not real_vllm",
                                      "chaoslike", "slow"])
def test_a_run_leaving_them_out_stays_parallel(markexpr: str) -> None:
    assert not selects_serial_tier(markexpr)


def test_every_test_module_has_its_own_name() -> None:
    # The test folders are not packages: pytest imports each module by its basename, so two
    # `test_x.py` in different tiers fail the whole collection ("import file mismatch").
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a module name"
        seen[path.name] = path
