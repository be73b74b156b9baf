"""Where a real request's time to first token goes, from a calibration's stored runs: what the
client measured through the gateway, against what vLLM itself measured of the same requests
(`engine_side`: the means of its queue, prefill and TTFT histograms over each run,
real_vllm.engine_side). vLLM 0.32's TTFT runs from the moment its renderer takes the prompt,
before tokenizing it (vllm/renderers/base.py ``render_cmpl_async`` stamps ``arrival_time``), to
the API server's handling of the engine core's output that carries the first token
(vllm/v1/metrics/stats.py ``IterationStats.update_from_output``, against the iteration's
``time.time()``), so what the client saw beyond it was spent outside vLLM's clock: the gateway
both ways, the HTTP server up to the renderer, and the first chunk's way out of the API server.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Row = dict[str, Any]


def _weighted(sides: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The mean over every run's requests, each run's mean weighted by its count."""
    runs = [(s[key], s["requests"]) for s in sides if s.get(key) is not None and s["requests"]]
    count = sum(n for _, n in runs)
    return sum(mean * n for mean, n in runs) / count if count else None


def outside_the_engine(data: Mapping[str, Any]) -> list[Row]:
    """Per workload and mode: the client's TTFT mean over every real run, vLLM's TTFT, queue
    and prefill means over the same runs, and the client's TTFT less vLLM's. Empty when the
    calibration stored no engine side (before 2026-12-02)."""
    engine_side = data.get("engine_side") or {}
    rows: list[Row] = []
    for name in ("a", "b"):
        runs = engine_side.get(name) or []
        for mode, samples in (data.get(f"workload_{name}_samples") or {}).items():
            sides = [run[mode] for run in runs if mode in run]
            vllm_ttft = _weighted(sides, "ttft_s")
            if not samples or vllm_ttft is None:
                continue
            client = statistics.fmean(s["ttft_s"] for s in samples)
            rows.append({
                "workload": name, "mode": mode, "requests": len(samples),
                "client_ttft_mean_s": client, "vllm_ttft_mean_s": vllm_ttft,
                "vllm_queue_mean_s": _weighted(sides, "queue_s"),
                "vllm_prefill_mean_s": _weighted(sides, "prefill_s"),
                "outside_mean_s": client - vllm_ttft,
            })
    return rows


def markdown(rows: Sequence[Row]) -> str:
    """The table of docs/benchmarks.md: milliseconds, per workload and mode."""
    if not rows:
        return ""

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.1f}"

    lines = ["| workload | mode | requests | client TTFT | vLLM TTFT | vLLM queue | vLLM prefill "
             "| outside vLLM |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload'].upper()} | {r['mode']} | {r['requests']} | "
                     f"{ms(r['client_ttft_mean_s'])} | {ms(r['vllm_ttft_mean_s'])} | "
                     f"{ms(r['vllm_queue_mean_s'])} | {ms(r['vllm_prefill_mean_s'])} | "
                     f"{ms(r['outside_mean_s'])} |")
    return "means in ms over every real run\n\n" + "\n".join(lines) + "\n"
