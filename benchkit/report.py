"""Per-request samples → per-mode figures → JSON, markdown table and PNG chart."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit.itl import ItlSamples


@dataclass(slots=True)
class ModeStats:
    """Accumulates the measured (post-warm-up) requests of one mode."""

    ttfts: list[float] = field(default_factory=list)  # emulated seconds, successful requests
    prompt_tokens: int = 0
    cached_tokens: int = 0
    hbm_tokens: int | None = 0  # None: the split is unknown (no engine metrics)
    ddr_tokens: int | None = 0
    errors: int = 0
    first_arrival: float = math.inf
    last_finish: float = 0.0
    # What the pool costs (the simulator fills these; None where unknown or without a pool):
    # tokens each request read from the DDR pool, and the pool's traffic over the run.
    ddr_reads: list[int] | None = field(default_factory=list)
    kv_bytes_per_token: int = 256 * 1024
    pool_read_gbps_mean: float | None = None
    pool_read_gbps_peak: float | None = None
    node_link_utilisation_p99: float | None = None
    # Requests arriving in ``window`` (a pool outage, say) also count apart.
    window: tuple[float, float] | None = None
    window_prompt_tokens: int = 0
    window_cached_tokens: int = 0
    # Inter-token gaps (the simulator's step accounting; None where not measured), and for a
    # prefill/decode mode, the measured turns it routed and those that skipped a prefill engine.
    itl: ItlSamples | None = None
    pd_turns: int | None = None
    pd_skipped: int = 0

    def add(self, arrival: float, ttft: float, finish: float, prompt: int, cached: int,
            hbm: int | None = None, ddr: int | None = None) -> None:
        self.ttfts.append(ttft)
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.hbm_tokens = None if hbm is None or self.hbm_tokens is None else self.hbm_tokens + hbm
        self.ddr_tokens = None if ddr is None or self.ddr_tokens is None else self.ddr_tokens + ddr
        if self.ddr_reads is not None:
            if ddr is None:
                self.ddr_reads = None
            else:
                self.ddr_reads.append(ddr)
        if self.window is not None and self.window[0] <= arrival < self.window[1]:
            self.window_prompt_tokens += prompt
            self.window_cached_tokens += cached
        self.first_arrival = min(self.first_arrival, arrival)
        self.last_finish = max(self.last_finish, finish)

    def error(self, arrival: float) -> None:
        self.errors += 1
        self.first_arrival = min(self.first_arrival, arrival)

    def figures(self) -> dict[str, Any]:
        prompt = self.prompt_tokens or 1
        span = self.last_finish - self.first_arrival
        return {
            "hit_rate": self.cached_tokens / prompt,
            "hbm_hit_rate": None if self.hbm_tokens is None else self.hbm_tokens / prompt,
            "ddr_hit_rate": None if self.ddr_tokens is None else self.ddr_tokens / prompt,
            "ttft_p50_s": percentile(self.ttfts, 50),
            "ttft_p90_s": percentile(self.ttfts, 90),
            "ttft_p99_s": percentile(self.ttfts, 99),
            "requests": len(self.ttfts) + self.errors,
            "errors": self.errors,
            "throughput_rps": len(self.ttfts) / span if span > 0 else 0.0,
            "itl_p50_s": None if self.itl is None else self.itl.percentile(50),
            "itl_p99_s": None if self.itl is None else self.itl.percentile(99),
            **self.pd_figures(),
            **self.cost_figures(),
        }

    def pd_figures(self) -> dict[str, Any]:
        """A prefill/decode mode's share of turns that never reached a prefill engine."""
        if self.pd_turns is None:
            return {}
        return {"prefill_skipped_share": self.pd_skipped / self.pd_turns if self.pd_turns
                else 0.0}

    def cost_figures(self) -> dict[str, Any]:
        """What the pool costs: DDR bytes read per request (mean, p99), the pool's read traffic
        (GB/s, mean and peak second), the nodes' links' utilisation p99 (over node-seconds)."""
        reads = self.ddr_reads
        per_token = self.kv_bytes_per_token
        if reads is not None:
            mean: float | None = per_token * sum(reads) / len(reads) if reads else 0.0
        else:  # only the total is known (`kvgate bench`: the engines' counters)
            served = len(self.ttfts)
            mean = (None if self.ddr_tokens is None or not served
                    else per_token * self.ddr_tokens / served)
        figures: dict[str, Any] = {
            "ddr_bytes_per_request_mean": mean,
            "ddr_bytes_per_request_p99": (None if reads is None else
                                          per_token * percentile(reads, 99)),
            "pool_read_gbps_mean": self.pool_read_gbps_mean,
            "pool_read_gbps_peak": self.pool_read_gbps_peak,
            "node_link_utilisation_p99": self.node_link_utilisation_p99,
        }
        if self.window is not None:
            figures["window_s"] = list(self.window)
            figures["window_hit_rate"] = (self.window_cached_tokens / self.window_prompt_tokens
                                          if self.window_prompt_tokens else None)
        return figures


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0.0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def result_document(workload: Mapping[str, Any], modes: Mapping[str, ModeStats],
                    oracle: float, no_queue: Sequence[float] | None = None) -> dict[str, Any]:
    """``no_queue``: each measured request's TTFT on an idle engine holding everything the
    oracle's cache would (the workload's bound; None: not computed)."""
    document: dict[str, Any] = {
        "workload": dict(workload), "modes": {m: s.figures() for m, s in modes.items()},
        "oracle_hit_rate": oracle}
    for pct in (50, 90, 99):
        document[f"no_queue_ttft_p{pct}_s"] = (None if not no_queue
                                               else percentile(no_queue, pct))
    return document


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def markdown_table(document: Mapping[str, Any]) -> str:
    rows = ["| mode | hit rate | HBM | DDR | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | ITL p99 "
            "| prefill skipped | requests | errors | req/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, f in document["modes"].items():
        rows.append(
            f"| {mode} | {_pct(f['hit_rate'])} | {_pct(f['hbm_hit_rate'])} | "
            f"{_pct(f['ddr_hit_rate'])} | {f['ttft_p50_s']:.2f} s | {f['ttft_p90_s']:.2f} s | "
            f"{f['ttft_p99_s']:.2f} s | {_num(f.get('itl_p50_s'), 1e-3, 0, ' ms')} | "
            f"{_num(f.get('itl_p99_s'), 1e-3, 0, ' ms')} | "
            f"{_pct(f.get('prefill_skipped_share'))} | {f['requests']} | {f['errors']} | "
            f"{f['throughput_rps']:.2f} |"
        )
    rows.append(f"\noracle hit rate (infinite cache, perfect routing): "
                f"{_pct(document['oracle_hit_rate'])}")
    if document.get("no_queue_ttft_p99_s") is not None:
        rows.append(f"\nno-queue bound (each request alone on an engine holding what the oracle "
                    f"would): TTFT p50 {document['no_queue_ttft_p50_s']:.2f} s, p90 "
                    f"{document['no_queue_ttft_p90_s']:.2f} s, p99 "
                    f"{document['no_queue_ttft_p99_s']:.2f} s")
    return "\n".join(rows) + "\n" + cost_table(document)


def _num(value: float | None, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    return "–" if value is None else f"{value / scale:.{digits}f}{unit}"


def cost_table(document: Mapping[str, Any]) -> str:
    """What the DDR pool costs each mode (modes without a pool show zeros or dashes)."""
    modes = document["modes"]
    window = any("window_hit_rate" in f for f in modes.values())
    head = ("| mode | DDR read/request mean | DDR read/request p99 | pool reads mean | "
            "pool reads peak | node link utilisation p99 |")
    rule = "|---|---:|---:|---:|---:|---:|"
    if window:
        head += " hit rate in the window |"
        rule += "---:|"
    rows = ["", "What the DDR pool costs (reads from the pool into HBM; GB = 10^9 bytes):", "",
            head, rule]
    for mode, f in modes.items():
        if "ddr_bytes_per_request_mean" not in f:
            continue
        row = (f"| {mode} | {_num(f['ddr_bytes_per_request_mean'], 1e9, 2, ' GB')} | "
               f"{_num(f['ddr_bytes_per_request_p99'], 1e9, 2, ' GB')} | "
               f"{_num(f['pool_read_gbps_mean'], 1, 2, ' GB/s')} | "
               f"{_num(f['pool_read_gbps_peak'], 1, 1, ' GB/s')} | "
               f"{_pct(f['node_link_utilisation_p99'])} |")
        if window:
            row += f" {_pct(f.get('window_hit_rate'))} |"
        rows.append(row)
    return "\n".join(rows) + "\n" if len(rows) > 5 else ""


CDF_POINTS = 4000  # per mode in the TTFT chart


def chart(document: Mapping[str, Any], ttfts: Mapping[str, Sequence[float]], path: Path,
          title: str, no_queue: Sequence[float] = ()) -> None:
    """TTFT distribution (CDF, log scale; the no-queue bound dashed) and hit rate per mode,
    side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Nine modes' labels need more room than five.
    wide = max(0, len(document["modes"]) - 5)
    fig, (left, right, costs) = plt.subplots(1, 3, figsize=(18 + 1.5 * wide, 4.8 + 0.3 * wide))
    curves = [*((mode, values, {}) for mode, values in ttfts.items()),
              ("no-queue bound", no_queue, {"color": "k", "linestyle": "--"})]
    for mode, values, style in curves:
        ordered = sorted(v for v in values if v > 0)
        if ordered:
            # A few thousand points draw the same curve as half a million, in a fraction of the
            # time: every step-th rank, and the last.
            ranks = [*range(0, len(ordered), max(1, len(ordered) // CDF_POINTS)), len(ordered) - 1]
            left.plot([ordered[i] for i in ranks], [(i + 1) / len(ordered) for i in ranks],
                      label=mode, **style)
    left.set_xscale("log")
    left.set_xlabel("TTFT (emulated seconds, log scale)")
    left.set_ylabel("share of requests")
    left.set_title("TTFT distribution (CDF)")
    left.grid(True, which="both", alpha=0.3)
    left.legend()
    modes = list(document["modes"])
    hbm = [100 * (document["modes"][m]["hbm_hit_rate"] or 0) for m in modes]
    ddr = [100 * (document["modes"][m]["ddr_hit_rate"] or 0) for m in modes]
    total = [100 * document["modes"][m]["hit_rate"] for m in modes]
    right.bar(modes, hbm, label="HBM")
    right.bar(modes, ddr, bottom=hbm, label="DDR pool")
    for i, value in enumerate(total):
        right.text(i, value + 1, f"{value:.1f} %", ha="center", fontsize=7 if wide else 10)
    right.axhline(100 * document["oracle_hit_rate"], color="k", linestyle="--", label="oracle")
    right.set_ylim(0, 105)
    right.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    right.set_title("hit rate")
    right.legend()
    right.tick_params(axis="x", labelrotation=30 if wide else 20)
    _cost_panel(costs, document)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cost_panel(ax: Any, document: Mapping[str, Any]) -> None:
    """DDR bytes read per request (mean bars, p99 marks), with each mode's pool traffic."""
    modes = list(document["modes"])
    figures = [document["modes"][m] for m in modes]
    mean = [(f.get("ddr_bytes_per_request_mean") or 0) / 1e9 for f in figures]
    p99 = [(f.get("ddr_bytes_per_request_p99") or 0) / 1e9 for f in figures]
    ax.bar(modes, mean, color="tab:purple", label="mean")
    ax.scatter(modes, p99, color="k", marker="_", s=400, label="p99", zorder=3)
    top = max([*p99, *mean, 1e-9])
    for i, f in enumerate(figures):
        if f.get("pool_read_gbps_mean") is None:
            continue
        ax.text(i, p99[i] + 0.03 * top,
                f"{f['pool_read_gbps_mean']:.1f} GB/s mean\n{f['pool_read_gbps_peak']:.0f} peak\n"
                f"links p99 {100 * (f['node_link_utilisation_p99'] or 0):.0f} %",
                ha="center", fontsize=6 if len(modes) > 5 else 7)
    ax.set_ylim(0, top * 1.35)
    ax.set_ylabel("DDR pool reads per request (GB)")
    ax.set_title("what the pool costs")
    ax.legend(loc="upper left")
    ax.tick_params(axis="x", labelrotation=30 if len(modes) > 5 else 20)


def check_out_dir(out: Path) -> None:
    """Fail now, not after an hour of benchmark, if results cannot be written to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out, prefix=".kvgate-write-check-"):
        pass


def write_outputs(out: Path, stem: str, document: Mapping[str, Any],
                  ttfts: Mapping[str, Sequence[float]], title: str,
                  no_queue: Sequence[float] = ()) -> list[Path]:
    """``<stem>.json``, ``<stem>.md``, ``<stem>.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(json.dumps(document, indent=2) + "\n")
    paths[1].write_text(f"# {title}\n\n{markdown_table(document)}")
    chart(document, ttfts, paths[2], title, no_queue)
    return paths
