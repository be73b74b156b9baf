"""The calibration's comparison: real runs against emulated ones per routing mode and timing
model, medians over repeated runs with their spread, and the markdown tables of
docs/results/calibration (a model column added to each).

The targets (issue 27): hit rates within 3 points, TTFT p50 within 25 % of the real engine's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.client import DriveResult
from emulator.timing import VLLM_STEPS
from kvgate.contract.modes import RoutingMode
from real_vllm.calibrate import Timing

Figures = dict[str, Any]  # ModeStats.figures() of one run
Runs = dict[str, list[Figures]]  # routing mode -> one run's figures per repeat
HIT_POINTS, TTFT_PCT = 3.0, 25.0
_MEDIAN_KEYS = ("hit_rate", "hbm_hit_rate", "ddr_hit_rate", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "requests", "errors", "throughput_rps")


def runs_of(results: Sequence[Mapping[RoutingMode, DriveResult]]) -> Runs:
    """Per mode, the figures of each repeat (``results``: one mapping per repeat)."""
    runs: Runs = {}
    for result in results:
        for mode, drive in result.items():
            runs.setdefault(str(mode), []).append(drive.stats.figures())
    return runs


def median_figures(runs: Sequence[Figures]) -> Figures:
    """Each figure's median over the runs (a lone run as it is)."""
    if len(runs) == 1:
        return dict(runs[0])
    out: Figures = {}
    for key in _MEDIAN_KEYS:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def comparison(real: Runs, emulated: Runs, model: str) -> list[dict[str, Any]]:
    """Per mode: the medians of both sides, how far apart they are against the targets, and
    every run's figures when there were several."""
    rows = []
    for mode, real_runs in real.items():
        a, b = median_figures(real_runs), median_figures(emulated[mode])
        hit_gap = abs(a["hit_rate"] - b["hit_rate"]) * 100
        ttft_gap = abs(b["ttft_p50_s"] - a["ttft_p50_s"]) / a["ttft_p50_s"] * 100
        row: dict[str, Any] = {
            "mode": mode, "model": model, "real": a, "emulated": b,
            "hit_rate_gap_points": round(hit_gap, 2), "ttft_p50_gap_pct": round(ttft_gap, 1),
            "hit_rate_ok": hit_gap <= HIT_POINTS, "ttft_p50_ok": ttft_gap <= TTFT_PCT,
            "repeats": {"real": len(real_runs), "emulated": len(emulated[mode])},
        }
        if len(real_runs) > 1 or len(emulated[mode]) > 1:
            row["real_runs"], row["emulated_runs"] = real_runs, emulated[mode]
        rows.append(row)
    return rows


def describe_timing(name: str, timing: Timing) -> str:
    """One line for a fit, in the model's own terms."""
    tail = (f"({timing.samples} samples, median TTFT residual "
            f"{timing.ttft_residual_p50_ms:.0f} ms)")
    if timing.prompt_us_per_token:
        tail = f"+ {timing.prompt_us_per_token:.2f} µs per prompt token " + tail
    if timing.scheduler == VLLM_STEPS:
        return (f"{name} [{VLLM_STEPS}]: API server {timing.prefill_overhead_ms:.1f} ms, step "
                f"{timing.step_ms:.1f} ms + {timing.prefill_tokens_per_s:,.0f} tokens/s, "
                f"budget {timing.max_num_batched_tokens:,} tokens/step {tail}")
    return (f"{name} [{timing.scheduler}]: c0 {timing.prefill_overhead_ms:.1f} ms, prefill "
            f"{timing.prefill_tokens_per_s:,.0f} tokens/s, decode "
            f"{timing.decode_ms_per_token:.1f} ms/token {tail}")


def _spread(row: Mapping[str, Any], kind: str, key: str, scale: float, fmt: str) -> str:
    runs = row.get(f"{kind}_runs") or []
    values = [r[key] * scale for r in runs if r.get(key) is not None]
    if len(values) < 2:
        return ""
    return f" [{min(values):{fmt}}–{max(values):{fmt}}]"


def _figure_row(row: Mapping[str, Any], kind: str, model: str) -> str:
    f = row[kind]
    hit = f"{f['hit_rate'] * 100:.1f} %{_spread(row, kind, 'hit_rate', 100, '.1f')}"
    p50 = f"{f['ttft_p50_s']:.3f} s{_spread(row, kind, 'ttft_p50_s', 1, '.3f')}"
    return (f"| {row['mode']} | {model} | {kind} | {hit} | {p50} | {f['ttft_p90_s']:.3f} s | "
            f"{f['requests']:g} | {f['errors']:g} |")


def markdown(title: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """The figures (real once per mode, then each model's emulated run; medians, with
    [min–max] over repeats) and the gaps, per mode and model."""
    lines = [
        title, "",
        "| mode | model | engine | hit rate | TTFT p50 | TTFT p90 | requests | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    shown: set[str] = set()
    for row in rows:
        if row["mode"] not in shown:
            shown.add(row["mode"])
            lines.append(_figure_row(row, "real", "—"))
        lines.append(_figure_row(row, "emulated", row["model"]))
    lines += ["", "| mode | model | hit-rate gap | TTFT p50 gap |", "|---|---|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['mode']} | {row['model']} | {row['hit_rate_gap_points']:.1f} "
                     f"points ({'ok' if row['hit_rate_ok'] else 'over 3'}) | "
                     f"{row['ttft_p50_gap_pct']:.0f} % "
                     f"({'ok' if row['ttft_p50_ok'] else 'over 25 %'}) |")
    return "\n".join(lines) + "\n"


def within_targets(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per model: comparisons made, TTFT p50 within 25 %, hit rate within 3 points."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        tally = out.setdefault(row["model"], {"comparisons": 0, "ttft_p50_ok": 0,
                                              "hit_rate_ok": 0})
        tally["comparisons"] += 1
        tally["ttft_p50_ok"] += bool(row["ttft_p50_ok"])
        tally["hit_rate_ok"] += bool(row["hit_rate_ok"])
    return out


def summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """``fcfs: TTFT p50 within 25 % in 3 of 4, hit rate within 3 points in 4 of 4; ...``."""
    return "; ".join(
        f"{model}: TTFT p50 within 25 % in {t['ttft_p50_ok']} of {t['comparisons']}, hit rate "
        f"within 3 points in {t['hit_rate_ok']} of {t['comparisons']}"
        for model, t in within_targets(rows).items())
