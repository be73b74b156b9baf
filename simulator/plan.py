"""Capacity plans: which fleets (engines x DDR pool size x pool bandwidth) to try, whether each
meets the goal, and the cheapest one that does. Pure: the simulations happen elsewhere."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchkit.report import _num


@dataclass(frozen=True, slots=True)
class Fleet:
    engines: int
    ddr_tokens: int | None  # None: the emulator's default (8 x the fleet's HBM)
    node_gbps: float | None = None  # None: the emulator's default


@dataclass(frozen=True, slots=True)
class Goal:
    ttft_p99_s: float
    min_hit_rate: float = 0.0
    itl_p99_s: float | None = None  # None: no inter-token goal

    def met_by(self, figures: Mapping[str, Any]) -> bool:
        itl = figures.get("itl_p99_s")
        return bool(figures["errors"] == 0 and figures["ttft_p99_s"] <= self.ttft_p99_s
                    and figures["hit_rate"] >= self.min_hit_rate
                    and (self.itl_p99_s is None or (itl is not None and itl <= self.itl_p99_s)))

    def strain(self, figures: Mapping[str, Any]) -> float:
        """The largest of the latency figures' ratios to their goals (below 1: met with room)."""
        ratio = figures["ttft_p99_s"] / self.ttft_p99_s
        if self.itl_p99_s is not None:
            ratio = max(ratio, (figures.get("itl_p99_s") or float("inf")) / self.itl_p99_s)
        return float(ratio)

    def describe(self) -> str:
        text = f"TTFT p99 <= {self.ttft_p99_s:g} s"
        if self.itl_p99_s is not None:
            text += f" and ITL p99 <= {1000 * self.itl_p99_s:g} ms"
        if self.min_hit_rate > 0:
            text += f" and hit rate >= {100 * self.min_hit_rate:g} %"
        return text

    def document(self) -> dict[str, Any]:
        """The goal in a plan's JSON (the inter-token goal only when there is one)."""
        out: dict[str, Any] = {"ttft_p99_s": self.ttft_p99_s, "min_hit_rate": self.min_hit_rate}
        if self.itl_p99_s is not None:
            out["itl_p99_s"] = self.itl_p99_s
        return {**out, "text": self.describe()}


def fleets(engines: Sequence[int], ddr_tokens: Sequence[int] | None,
           node_gbps: Sequence[float] | None = None) -> list[Fleet]:
    """Every combination, cheapest first: fewer engines, then a smaller pool, then narrower
    links."""
    pools: Sequence[int | None] = sorted(set(ddr_tokens)) if ddr_tokens else [None]
    links: Sequence[float | None] = sorted(set(node_gbps)) if node_gbps else [None]
    return [Fleet(e, d, g) for e in sorted(set(engines)) for d in pools for g in links]


def cheapest(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first row (rows are cheapest first) that meets the goal."""
    return next((row for row in rows if row["meets_goal"]), None)


def _tokens(value: int) -> str:
    return f"{value / 1e6:.1f}M" if value >= 1_000_000 else f"{value / 1e3:.0f}k"


def _itl(row: Mapping[str, Any]) -> str:
    return f"{_num(row.get('itl_p99_s'), 1e-3, 0, ' ms')} | "


def _uses_pool(document: Mapping[str, Any]) -> bool:
    return str(document["mode"]).endswith("+ddr")


def markdown_plan(document: Mapping[str, Any]) -> str:
    itl = "itl_p99_s" in document["goal"]  # the column only with an inter-token goal
    rows = ["| engines | DDR pool | node link | hit rate | HBM | DDR | TTFT p50 | TTFT p99 | "
            f"{'ITL p99 | ' if itl else ''}pool reads mean / peak | errors | meets goal |",
            f"|---:|---:|---:|---:|---:|---:|---:|---:|{'---:|' if itl else ''}---:|---:|---|"]
    pooled = _uses_pool(document)
    for row in document["fleets"]:
        pool = (f"{_tokens(row['ddr_tokens'])} tokens ({row['ddr_tib']:.1f} TiB)"
                if pooled else "–")
        link = f"{row['node_gbps']:g} GB/s" if pooled and row.get("node_gbps") else "–"
        traffic = (f"{row['pool_read_gbps_mean']:.1f} / {row['pool_read_gbps_peak']:.0f} GB/s"
                   if row.get("pool_read_gbps_mean") is not None else "–")
        rows.append(
            f"| {row['engines']} | {pool} | {link} | {100 * row['hit_rate']:.1f} % | "
            f"{100 * (row['hbm_hit_rate'] or 0):.1f} % | "
            f"{100 * (row['ddr_hit_rate'] or 0):.1f} % | "
            f"{row['ttft_p50_s']:.2f} s | {row['ttft_p99_s']:.2f} s | "
            f"{_itl(row) if itl else ''}{traffic} | "
            f"{row['errors']} | "
            f"{'yes' if row['meets_goal'] else 'no'} |")
    best = document["cheapest"]
    goal = document["goal"]["text"]
    if best is None:
        rows.append(f"\nno fleet tried meets {goal} in mode {document['mode']}")
    else:
        pool = (f", DDR pool {_tokens(best['ddr_tokens'])} tokens, node link "
                f"{best['node_gbps']:g} GB/s (pool reads peak {best['pool_read_gbps_peak']:.0f} "
                f"GB/s)" if pooled else "")
        rows.append(f"\nsmallest fleet meeting {goal} in mode {document['mode']}: "
                    f"{best['engines']} engines{pool}")
    return "\n".join(rows) + "\n"
