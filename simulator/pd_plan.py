"""`kvgate plan --pd`: which prefill:decode splits of each fleet size to try, and the smallest
fleet and split that meet a TTFT and an inter-token goal. Pure: the simulations happen
elsewhere (``simulator.plan_command``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchkit.report import _num, _pct
from simulator.plan import Goal

# The prefill share of each fleet tried by default: the committed P/D runs' 4:12 and 8:8.
DEFAULT_PREFILL_SHARES = (0.25, 0.5)


def splits(engines: Sequence[int], shares: Sequence[float] | None = None,
           explicit: Sequence[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """``(prefill, decode)`` splits, cheapest first (fewer engines, then fewer prefill ones),
    once each. ``explicit`` splits must each add up to one of ``engines``; otherwise each
    fleet size is split by ``shares`` (rounded, at least one engine on each side)."""
    totals = sorted(set(engines))
    for total in totals:
        if total < 2:
            raise ValueError(f"--engines {total}: a P/D fleet needs at least 2 engines "
                             "(1 prefill + 1 decode)")
    if explicit:
        for p, d in explicit:
            if p + d not in totals:
                raise ValueError(f"--splits {p}:{d} is {p + d} engines, not one of --engines "
                                 f"{','.join(map(str, totals))}")
        for total in totals:
            if not any(p + d == total for p, d in explicit):
                raise ValueError(f"--engines {total}: no split of it in --splits")
        return sorted(set(explicit), key=lambda s: (sum(s), s[0]))
    found = {(p, total - p) for total in totals  # halves round up (0.25 x 10 is 3)
             for p in (min(total - 1, max(1, int(share * total + 0.5)))
                       for share in (shares or DEFAULT_PREFILL_SHARES))}
    return sorted(found, key=lambda s: (sum(s), s[0]))


def check_shares(shares: Sequence[float]) -> None:
    for share in shares:
        if not 0 < share < 1:
            raise ValueError(f"--prefill-shares must each be in (0, 1), got {share:g}")


def best_split(rows: Sequence[Mapping[str, Any]], goal: Goal) -> Mapping[str, Any] | None:
    """The smallest fleet meeting the goal and, of its splits that do, the one with the most
    headroom (the lowest of its figures' ratios to their goals)."""
    meeting = [row for row in rows if row["meets_goal"]]
    if not meeting:
        return None
    smallest = min(row["engines"] for row in meeting)
    return min((row for row in meeting if row["engines"] == smallest), key=goal.strain)


def markdown_pd_plan(document: Mapping[str, Any]) -> str:
    rows = ["| engines | prefill:decode | hit rate | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | "
            "prefill skipped | errors | meets goal |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in document["fleets"]:
        rows.append(
            f"| {row['engines']} | {row['prefill_engines']}:{row['decode_engines']} | "
            f"{_pct(row['hit_rate'])} | {row['ttft_p50_s']:.2f} s | {row['ttft_p99_s']:.2f} s | "
            f"{_num(row.get('itl_p50_s'), 1e-3, 0, ' ms')} | "
            f"{_num(row.get('itl_p99_s'), 1e-3, 0, ' ms')} | "
            f"{_pct(row.get('prefill_skipped_share'))} | {row['errors']} | "
            f"{'yes' if row['meets_goal'] else 'no'} |")
    best, goal, mode = document["cheapest"], document["goal"]["text"], document["mode"]
    if best is None:
        rows.append(f"\nno split tried meets {goal} in mode {mode}")
    else:
        rows.append(f"\nsmallest fleet meeting {goal} in mode {mode}: {best['engines']} "
                    f"engines, {best['prefill_engines']} prefill : {best['decode_engines']} "
                    "decode")
    return "\n".join(rows) + "\n"
