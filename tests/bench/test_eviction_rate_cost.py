"""bench/eviction_rate_cost.py: what the eviction-rate column costs a round."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import eviction_rate_cost


def test_the_column_is_a_packed_double_per_engine_and_its_cost_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    figures = eviction_rate_cost.measure(engines=50, rounds=150)
    assert figures["bytes"] == pytest.approx(8.0, abs=0.1)  # 8 bytes a rate, packed
    assert figures["collector_cpu_s"] > 0
    out = tmp_path / "evictions.json"
    assert eviction_rate_cost.main(["--engines", "20", "--rounds", "120",
                                       "--json", str(out)]) == 0
    assert "20 engines, 8 replicas" in capsys.readouterr().out
    assert out.read_text().startswith("{")
