"""The connector profiles' table and the load sweep, from the committed simulation results.

`docs/regenerate.sh profiles load load-profiles` runs the simulations (`kvgate simulate`, one
JSON each); this script reads them and writes, under docs/results:

- ``pool-profiles.{json,md}``: the key scenarios (bank-coding, agentic-coding at 480 and 960
  sessions, a pool of 1x the fleet's HBM, the pool down for 10 minutes, the Mooncake trace), every
  mode that uses the pool, TTFT p99 and DDR bytes read per request under each connector profile,
  and issue 25's targets judged under each;
- ``load-sweep-{agentic,bank}-coding.{json,md,png}``: TTFT p99 and DDR bytes per request of every
  mode against the load, default profile (the other profiles' points in the JSON).

    python bench/pool_sweep.py            # both
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DEFAULT = "ascend-store"
OTHERS = ("lmcache", "mooncake", "vllm-offload")
PROFILES = (DEFAULT, *OTHERS)
DDR_MODES = ("affinity+ddr", "round_robin+ddr", "sticky+ddr", "prefix-score", "kv-cost",
             "bounded-hash")
# scenario -> (its title, the committed default-profile result, the profiles/ runs' prefix)
SCENARIOS = {
    "bank-coding": ("bank-coding, 16 engines", "simulate-bank-coding", "bank-coding"),
    "agentic-480": ("agentic-coding, 480 sessions", "simulate-agentic-coding",
                    "agentic-coding-480"),
    "agentic-960": ("agentic-coding, 960 sessions", "simulate-agentic-coding-960",
                    "agentic-coding-960"),
    "small-pool": ("bank-coding, pool 1x the fleet's HBM", "simulate-small-pool-bank-coding",
                   "small-pool-bank-coding"),
    "pool-fail": ("bank-coding, pool down 10 min", "simulate-pool-fail-bank-coding",
                  "pool-fail-bank-coding"),
    "mooncake-trace": ("Mooncake trace", "simulate-mooncake-trace", "mooncake-trace"),
}
GB = 1e9


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _scenario(key: str, profile: str) -> dict[str, Any] | None:
    _, committed, prefix = SCENARIOS[key]
    if profile == DEFAULT:
        return _load(RESULTS / f"{committed}.json")
    return _load(RESULTS / "profiles" / f"{prefix}-{profile}.json")


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures issues 16 and 25 judge on one result: kvgate's p99 against the no-queue bound
    and the best other mode's, its DDR bytes per request against round robin's, its hit rate
    against static stickiness's."""
    modes = doc["modes"]
    kv = modes["affinity+ddr"]
    others = {m: f["ttft_p99_s"] for m, f in modes.items()
              if m != "affinity+ddr" and m in DDR_MODES}
    best_other = min(others, key=lambda m: others[m])
    rr_bytes = modes["round_robin+ddr"]["ddr_bytes_per_request_mean"]
    bound = doc.get("no_queue_ttft_p99_s")
    return {
        "p99_s": kv["ttft_p99_s"], "no_queue_p99_s": bound,
        "vs_bound": kv["ttft_p99_s"] / bound if bound else None,
        "best_other": best_other, "vs_best_other": kv["ttft_p99_s"] / others[best_other],
        "ddr_vs_round_robin": kv["ddr_bytes_per_request_mean"] / rr_bytes if rr_bytes else None,
        "hit_vs_sticky": kv["hit_rate"] / modes["sticky+ddr"]["hit_rate"],
    }


def profiles_document() -> dict[str, Any]:
    scenarios: dict[str, Any] = {}
    for key, (title, _, _) in SCENARIOS.items():
        per_profile: dict[str, Any] = {}
        for profile in PROFILES:
            doc = _scenario(key, profile)
            if doc is None:
                continue
            per_profile[profile] = {
                "no_queue_ttft_p99_s": doc.get("no_queue_ttft_p99_s"),
                "modes": {m: {k: doc["modes"][m][k] for k in (
                    "ttft_p99_s", "hit_rate", "ddr_bytes_per_request_mean", "errors")}
                    for m in DDR_MODES if m in doc["modes"]},
            }
            per_profile[profile]["targets"] = targets(doc)
        scenarios[key] = {"title": title, "profiles": per_profile}
    return {"default_profile": DEFAULT, "scenarios": scenarios}


def _head(columns: Sequence[str], first: str = "mode") -> list[str]:
    """A Markdown table's header and rule: ``first``, then ``columns`` right-aligned."""
    return [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]


def _mode_rows(modes: Iterable[str], columns: Sequence[Mapping[str, Any]],
               zero_ddr: bool) -> list[str]:
    """A row a mode: in each column (a run's figures by mode), TTFT p99 (s) / DDR read per
    request (GB), "–" where the mode did not run; a zero DDR read is shown only if ``zero_ddr``."""
    rows = []
    for mode in modes:
        cells = []
        for figures in columns:
            f = figures.get(mode)
            if f is None:
                cells.append("–")
                continue
            ddr = f["ddr_bytes_per_request_mean"]
            cells.append(f"{f['ttft_p99_s']:.2f}"
                         + (f" / {ddr / GB:.2f}" if ddr or zero_ddr else ""))
        rows.append(f"| {mode} | " + " | ".join(cells) + " |")
    return rows


def profiles_markdown(document: dict[str, Any]) -> str:
    lines = ["# Key figures under each connector profile", "",
             "TTFT p99 (s) / DDR read per request (GB); kvgate is `affinity+ddr`. "
             f"`{DEFAULT}` is the default (the committed results).", ""]
    for scenario in document["scenarios"].values():
        profiles = [p for p in PROFILES if p in scenario["profiles"]]
        lines += [f"**{scenario['title']}**", "", *_head([f"`{p}`" for p in profiles]),
                  *_mode_rows(DDR_MODES, [scenario["profiles"][p]["modes"] for p in profiles],
                              zero_ddr=True), ""]
        targets = {p: scenario["profiles"][p].get("targets") for p in profiles}
        if any(targets.values()):
            lines += _head([f"`{p}`" for p in profiles], "target")
            rows = (("kvgate's p99 ÷ the no-queue bound", "vs_bound", "{:.2f}"),
                    ("kvgate's p99 ÷ the best other mode's", "vs_best_other", "{:.3f}"),
                    ("kvgate's DDR bytes ÷ round_robin+ddr's", "ddr_vs_round_robin", "{:.2f}"),
                    ("kvgate's hit rate ÷ sticky+ddr's", "hit_vs_sticky", "{:.3f}"))
            for label, key, fmt in rows:
                cells = [fmt.format(t[key]) if t and t[key] is not None else "–"
                         for t in targets.values()]
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            best = [f"{t['best_other']}" if t else "–" for t in targets.values()]
            lines.append("| the best other mode | " + " | ".join(best) + " |")
            lines.append("")
    return "\n".join(lines)


# workload -> (its points in sessions, the default load, the committed results for some points)
LOADS = {
    "agentic-coding": ((240, 480, 960, 1440, 1920), 480,
                       {480: "simulate-agentic-coding", 960: "simulate-agentic-coding-960"}),
    "bank-coding": ((1600, 3200, 6400, 9600, 12800), 3200, {3200: "simulate-bank-coding"}),
}


def _load_point(workload: str, sessions: int, profile: str) -> dict[str, Any] | None:
    committed = LOADS[workload][2].get(sessions)
    if profile == DEFAULT:
        if committed is not None:
            return _load(RESULTS / f"{committed}.json")
        return _load(RESULTS / "load" / f"{workload}-{sessions}.json")
    return _load(RESULTS / "load" / f"{workload}-{sessions}-{profile}.json")


def load_document(workload: str) -> dict[str, Any]:
    points, default, _ = LOADS[workload]
    out: dict[str, Any] = {"workload": workload, "default_sessions": default,
                           "default_profile": DEFAULT, "points": []}
    for n in points:
        point: dict[str, Any] = {"sessions": n, "profiles": {}}
        for profile in PROFILES:
            doc = _load_point(workload, n, profile)
            if doc is None:
                continue
            point["profiles"][profile] = {
                "no_queue_ttft_p99_s": doc.get("no_queue_ttft_p99_s"),
                "modes": {m: {"ttft_p99_s": f["ttft_p99_s"], "hit_rate": f["hit_rate"],
                              "ddr_bytes_per_request_mean": f["ddr_bytes_per_request_mean"]}
                          for m, f in doc["modes"].items()}}
        out["points"].append(point)
    return out


def _kvgate_loses(modes: dict[str, Any]) -> list[str]:
    """The modes whose p99 beats kvgate's by more than 5 %."""
    kv = modes["affinity+ddr"]["ttft_p99_s"]
    return [m for m, f in modes.items() if f["ttft_p99_s"] < kv / 1.05]


def load_markdown(document: dict[str, Any]) -> str:
    points = [p for p in document["points"] if DEFAULT in p["profiles"]]
    if not points:
        return ""
    modes = list(points[0]["profiles"][DEFAULT]["modes"])
    title = document["workload"]
    lines = [f"# Load sweep: {title}", "",
             f"TTFT p99 (s) / DDR read per request (GB), `{DEFAULT}` profile; the default load "
             f"is {document['default_sessions']} sessions.", "",
             *_head([f"{p['sessions']}" for p in points]),
             *_mode_rows(modes, [p["profiles"][DEFAULT]["modes"] for p in points],
                         zero_ddr=False)]
    bound = [p["profiles"][DEFAULT].get("no_queue_ttft_p99_s") for p in points]
    lines.append("| no-queue bound | " + " | ".join(
        "–" if b is None else f"{b:.2f}" for b in bound) + " |")
    lines.append("")
    losses = [(p["sessions"], profile, _kvgate_loses(f["modes"]))
              for p in document["points"] for profile, f in p["profiles"].items()]
    lost = [(n, prof, ms) for n, prof, ms in losses if ms]
    lines.append("Points where a mode beats kvgate's p99 by more than 5 %: "
                 + ("; ".join(f"{n} sessions, `{prof}`: {', '.join(ms)}" for n, prof, ms in lost)
                    if lost else "none") + ".")
    return "\n".join(lines) + "\n"


def load_chart(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in document["points"] if DEFAULT in p["profiles"]]
    modes = list(points[0]["profiles"][DEFAULT]["modes"])
    x = [p["sessions"] for p in points]
    fig, (tail, traffic) = plt.subplots(1, 2, figsize=(15, 5))
    for mode in modes:
        style = {"linewidth": 2.5} if mode == "affinity+ddr" else {}
        p99 = [p["profiles"][DEFAULT]["modes"][mode]["ttft_p99_s"] for p in points]
        tail.plot(x, p99, marker="o", label=mode, **style)
        ddr = [p["profiles"][DEFAULT]["modes"][mode]["ddr_bytes_per_request_mean"] / GB
               for p in points]
        if any(ddr):
            traffic.plot(x, ddr, marker="o", label=mode, **style)
    bound = [p["profiles"][DEFAULT]["no_queue_ttft_p99_s"] for p in points]
    if all(b is not None for b in bound):
        tail.plot(x, bound, "k--", label="no-queue bound")
    tail.set_yscale("log")
    tail.set_xlabel("sessions in the hour")
    tail.set_ylabel("TTFT p99 (s, log scale)")
    tail.set_title("TTFT p99 against the load")
    tail.grid(True, which="both", alpha=0.3)
    tail.legend(fontsize=8)
    traffic.set_xlabel("sessions in the hour")
    traffic.set_ylabel("DDR read per request (GB)")
    traffic.set_title("what the pool serves")
    traffic.grid(True, alpha=0.3)
    traffic.legend(fontsize=8)
    fig.suptitle(f"{document['workload']}, 16 engines, {DEFAULT} profile")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    document = profiles_document()
    (RESULTS / "pool-profiles.json").write_text(json.dumps(document, indent=1) + "\n")
    (RESULTS / "pool-profiles.md").write_text(profiles_markdown(document))
    print(f"wrote {RESULTS / 'pool-profiles.md'}")
    for workload in LOADS:
        doc = load_document(workload)
        stem = RESULTS / f"load-sweep-{workload}"
        Path(f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
        text = load_markdown(doc)
        if text:
            Path(f"{stem}.md").write_text(text)
            load_chart(doc, Path(f"{stem}.png"))
            print(f"wrote {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
