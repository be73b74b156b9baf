"""What the engines measured of a run, from vLLM's histograms before and after: means per
request, summed over engines (real_vllm/engine_side.py); and what the client's TTFT spent outside
vLLM's own clock (real_vllm/outside.py)."""

from __future__ import annotations

import pytest

from real_vllm.engine_side import means, totals_of
from real_vllm.outside import markdown, outside_the_engine


def page(queue: tuple[float, int], prefill: tuple[float, int], ttft: tuple[float, int]) -> str:
    lines = []
    for name, (total, count) in (("vllm:request_queue_time_seconds", queue),
                                 ("vllm:request_prefill_time_seconds", prefill),
                                 ("vllm:time_to_first_token_seconds", ttft)):
        lines += [f"# TYPE {name} histogram",
                  f'{name}_bucket{{le="+Inf",model_name="m"}} {count}',
                  f'{name}_sum{{model_name="m"}} {total}',
                  f'{name}_count{{model_name="m"}} {count}']
    return "\n".join(lines) + "\n"


def test_means_over_the_run_summed_over_engines() -> None:
    before = totals_of([page((1.0, 10), (2.0, 10), (4.0, 10)), page((0.0, 0), (0.0, 0),
                                                                   (0.0, 0))])
    after = totals_of([page((1.5, 20), (3.0, 20), (5.0, 20)), page((0.5, 10), (1.0, 10),
                                                                  (1.0, 10))])
    # 20 requests in the run: queue 1.0 s, prefill 2.0 s, TTFT 2.0 s in all.
    assert means(before, after) == {"queue_s": 0.05, "prefill_s": 0.1, "ttft_s": 0.1,
                                    "requests": 20.0}
    assert means(after, after)["ttft_s"] is None  # no request between the readings


def test_the_client_ttft_less_vllms_own_is_what_was_spent_outside_it() -> None:
    side = {"queue_s": 0.01, "prefill_s": 0.02, "ttft_s": 0.04, "requests": 2.0}
    data = {
        "engine_side": {"a": [{"affinity": side},
                              {"affinity": {**side, "ttft_s": 0.07, "requests": 1.0}}],
                        "b": []},
        "workload_a_samples": {"affinity": [{"ttft_s": 0.05}, {"ttft_s": 0.07},
                                            {"ttft_s": 0.09}]},
        "workload_b_samples": {"affinity": [{"ttft_s": 0.2}]},  # no engine side: left out
    }
    [row] = outside_the_engine(data)
    assert (row["workload"], row["mode"], row["requests"]) == ("a", "affinity", 3)
    assert row["vllm_ttft_mean_s"] == pytest.approx(0.05)  # (2 × 0.04 + 0.07) / 3
    assert row["client_ttft_mean_s"] == pytest.approx(0.07)
    assert row["outside_mean_s"] == pytest.approx(0.02)
    assert row["vllm_queue_mean_s"] == pytest.approx(0.01)
    table = markdown([row])
    assert "| A | affinity | 3 | 70.0 | 50.0 | 10.0 | 20.0 | 20.0 |" in table
    assert outside_the_engine({"workload_a_samples": data["workload_a_samples"]}) == []
