"""What the engines measured of a run, from vLLM's histograms before and after: means per
request, summed over engines (real_vllm/engine_side.py)."""

from __future__ import annotations

from real_vllm.engine_side import means, totals_of


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
