"""bench/pool_sweep.py: the targets it judges and the losses it reports, on hand-made results."""

from __future__ import annotations

from typing import Any

import pytest

from bench.pool_sweep import DDR_MODES, _kvgate_loses, load_markdown, targets


def _doc(p99: dict[str, float]) -> dict[str, Any]:
    return {"no_queue_ttft_p99_s": 2.0,
            "modes": {m: {"ttft_p99_s": p99.get(m, 10.0), "hit_rate": 0.8,
                          "ddr_bytes_per_request_mean": 4e9 if m == "round_robin+ddr" else 1e9}
                      for m in (*DDR_MODES, "round_robin")}}


def test_targets_compare_kvgate_with_the_bound_and_the_best_other_mode() -> None:
    doc = _doc({"affinity+ddr": 2.4, "prefix-score": 2.3, "round_robin": 1.0})
    t = targets(doc)
    assert t["vs_bound"] == pytest.approx(1.2)
    # Modes without the pool are not its rivals here.
    assert t["best_other"] == "prefix-score" and t["vs_best_other"] == pytest.approx(2.4 / 2.3)
    assert t["ddr_vs_round_robin"] == pytest.approx(0.25) and t["hit_vs_sticky"] == 1.0


def test_a_mode_more_than_5_percent_faster_than_kvgate_is_reported() -> None:
    assert _kvgate_loses(_doc({"affinity+ddr": 2.0, "kv-cost": 1.95})["modes"]) == []
    modes = _doc({"affinity+ddr": 2.0, "kv-cost": 1.8})["modes"]
    assert _kvgate_loses(modes) == ["kv-cost"]
    sweep = {"workload": "w", "default_sessions": 1,
             "points": [{"sessions": 1, "profiles": {"ascend-store": {
                 "no_queue_ttft_p99_s": 1.0, "modes": modes}}}]}
    assert "1 sessions, `ascend-store`: kv-cost" in load_markdown(sweep)
