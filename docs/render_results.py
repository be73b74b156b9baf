"""Put each committed result's table into the docs.

Every `<!-- result: NAME -->` ... `<!-- /result -->` block of README.md and docs/**/*.md gets
docs/results/NAME.md (or docs/results/sweep/NAME.md) without its title, so the docs quote exactly
what the documented commands wrote. A few NAMEs are tables built here from the committed JSON
(`TABLES` below: summaries across runs). Run from the repository's root after regenerating
results: `python docs/render_results.py`. `python docs/render_results.py --check` changes nothing
and exits 1 if a block differs from what it would render (tests/unit/test_docs_results.py)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
BLOCK = re.compile(r"<!-- result: (?P<name>[\w.-]+) -->\n.*?<!-- /result -->", re.S)

# The simulations summarised in one table: (result name, what differs from the default run).
SCENARIOS = (
    ("simulate-bank-coding", "default: bank-coding, 16 engines, pool 8× HBM"),
    ("simulate-skewed-bank-coding", "contexts σ 1.0, 10 turns a session"),
    ("simulate-pool-fail-bank-coding", "pool down 10 min at the peak"),
    ("simulate-small-pool-bank-coding", "pool 1× the fleet's HBM"),
    ("simulate-slow-pool-bank-coding", "pool at a quarter of its bandwidth"),
    ("simulate-failover-bank-coding", "engine 3 fails, engine 5 drained"),
    ("simulate-agentic-coding", "agentic-coding, 480 sessions"),
    ("simulate-agentic-coding-960", "agentic-coding, 960 sessions"),
    ("simulate-mooncake-trace", "Mooncake conversation trace"),
    ("simulate-fleet-1000-engines", "1,000 engines, 100,000 sessions"),
)
SUMMARY_MODES = ("round_robin", "round_robin+ddr", "affinity+ddr", "sticky+ddr", "prefix-score")

# The plans summarised: (result name, what is varied).
PLANS = (
    ("plan-bank-coding", "engines"),
    ("plan-sticky-ddr-bank-coding", "engines"),
    ("plan-round-robin-ddr-bank-coding", "engines"),
    ("plan-round-robin-bank-coding", "engines"),
    ("plan-ddr-bank-coding", "pool size, 12 engines"),
    ("plan-bandwidth-affinity-ddr-bank-coding", "node link, 16 engines"),
    ("plan-bandwidth-round-robin-ddr-bank-coding", "node link, 16 engines"),
    ("plan-skewed-bank-coding", "engines, skewed load"),
    ("plan-skewed-sticky-ddr-bank-coding", "engines, skewed load"),
)

POOL_MODES = ("round_robin+ddr", "affinity+ddr", "sticky+ddr", "prefix-score", "kv-cost",
              "bounded-hash")

# The real runs beside their simulations on the same engine addresses: (real, simulated).
REAL_VS_SIM = (
    ("bench-compare-bank-coding", "simulate-small-bank-coding"),
    ("bench-compare-mooncake-trace", "simulate-small-mooncake-trace"),
    ("bench-compare-collector-bank-coding", "simulate-small-hbm-residency-bank-coding"),
)


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return doc


def table(name: str) -> str:
    for folder in (RESULTS, RESULTS / "sweep"):
        path = folder / f"{name}.md"
        if path.exists():
            text = path.read_text()
            if text.startswith("# "):  # the title line
                text = text.split("\n", 1)[1].lstrip("\n")
            return text.rstrip("\n")
    raise SystemExit(f"render_results: no docs/results/{name}.md")


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def secs(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def gb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e9:.2f} GB"


def sweep_table() -> str:
    """The sweep's runs (docs/results/sweep/sweep-ENGINES-SYSTEM.json), one row each."""
    rows = ["| engines | `--system-tokens` | round_robin hit rate | round_robin TTFT p99 | "
            "affinity+ddr hit rate | affinity+ddr TTFT p99 | oracle |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for engines in (16, 64, 256):
        for system in (1500, 1000, 500, 0):
            doc = load(f"sweep/sweep-{engines}-{system}")
            rr, kv = doc["modes"]["round_robin"], doc["modes"]["affinity+ddr"]
            label = f"{system} (default)" if (engines, system) == (16, 1000) else str(system)
            rows.append(f"| {engines} | {label} | {100 * rr['hit_rate']:.1f} % | "
                        f"{rr['ttft_p99_s']:.0f} s | {100 * kv['hit_rate']:.1f} % | "
                        f"{kv['ttft_p99_s']:.1f} s | {100 * doc['oracle_hit_rate']:.1f} % |")
    return "\n".join(rows)


def scenarios_table() -> str:
    """Hit rate and TTFT p99 of the main modes in every committed scenario."""
    head = " | ".join(f"{mode}" for mode in SUMMARY_MODES)
    rows = [f"| run | scenario | {head} | no-queue p99 |",
            "|---|---|" + "---:|" * (len(SUMMARY_MODES) + 1)]
    for name, scenario in SCENARIOS:
        doc = load(name)
        cells = []
        for mode in SUMMARY_MODES:
            figures = doc["modes"].get(mode)
            cells.append("–" if figures is None else
                         f"{pct(figures['hit_rate'])}, {secs(figures['ttft_p99_s'])}")
        rows.append(f"| [{name}](results/{name}.md) | {scenario} | {' | '.join(cells)} | "
                    f"{secs(doc.get('no_queue_ttft_p99_s'))} |")
    return "\n".join(rows)


def plans_table() -> str:
    """Each committed plan's mode, what it varies, and the cheapest fleet meeting its goal."""
    rows = ["| run | mode | varied | goal | cheapest fleet meeting it |", "|---|---|---|---|---|"]
    for name, varied in PLANS:
        doc = load(name)
        best = doc["cheapest"]
        answer = "none of the fleets tried" if best is None else (
            f"{best['engines']} engines, pool {best['ddr_tokens'] / 1e6:.1f}M tokens, "
            f"node link {best['node_gbps']:.0f} GB/s, TTFT p99 {secs(best['ttft_p99_s'])}"
            if doc["mode"] in POOL_MODES else
            f"{best['engines']} engines, TTFT p99 {secs(best['ttft_p99_s'])}")
        rows.append(f"| [{name}](results/{name}.md) | {doc['mode']} | {varied} | "
                    f"{doc['goal']['text']} | {answer} |")
    return "\n".join(rows)


def real_vs_sim_table() -> str:
    """Each mode of a real run beside the simulation on the same engine addresses."""
    rows = ["| workload | mode | hit rate real / sim | HBM real / sim | TTFT p99 real / sim | "
            "DDR read per request real / sim |", "|---|---|---:|---:|---:|---:|"]
    for real_name, sim_name in REAL_VS_SIM:
        real, sim = load(real_name)["modes"], load(sim_name)["modes"]
        for mode, r in real.items():
            s = sim[mode]
            rows.append(
                f"| [{real_name}](results/{real_name}.md) | {mode} | "
                f"{pct(r['hit_rate'])} / {pct(s['hit_rate'])} | "
                f"{pct(r['hbm_hit_rate'])} / {pct(s['hbm_hit_rate'])} | "
                f"{secs(r['ttft_p99_s'])} / {secs(s['ttft_p99_s'])} | "
                f"{gb(r['ddr_bytes_per_request_mean'])} / {gb(s['ddr_bytes_per_request_mean'])} |")
    return "\n".join(rows)


def fleet_state_table() -> str:
    """Fleet state's cost at 1,000 engines and 8 replicas, from the 2026-12-05 runs."""
    cost = load("fleet-state-cost-2026-12-05")
    scale = load("fleet-state-at-scale-2026-12-05")
    rates = load("fleet-state-evictions-2026-12-05")
    per, cores = cost["per_engine"], cost["projection"]["cores"]
    fleet = f"{scale['engines']:,} engines"
    figures = [
        ("a replica scraping a whole vLLM page, per engine",
         f"{per['scrape_whole_cpu_s'] * 1e6:.1f} µs", "cost, `per_engine.scrape_whole_cpu_s`"),
        ("the same, the three gauges only",
         f"{per['scrape_filtered_cpu_s'] * 1e6:.1f} µs",
         "cost, `per_engine.scrape_filtered_cpu_s`"),
        ("the collector's scrape, kvgate's client",
         f"{per['collector_scrape_cpu_s'] * 1e6:.1f} µs",
         "cost, `per_engine.collector_scrape_cpu_s`"),
        ("the same, aiohttp's client", f"{per['collector_scrape_aiohttp_cpu_s'] * 1e6:.1f} µs",
         "cost, `per_engine.collector_scrape_aiohttp_cpu_s`"),
        ("a replica taking a round, per engine", f"{per['delivery_replica_cpu_s'] * 1e6:.2f} µs",
         "cost, `per_engine.delivery_replica_cpu_s`"),
        ("a stored block's events into HBM residency",
         f"{per['residency_cpu_s_per_block'] * 1e6:.1f} µs",
         "cost, `per_engine.residency_cpu_s_per_block`"),
        (f"the collector at {fleet}, {scale['feeds']} feeds, measured",
         f"{scale['cores']:.2f} core", "at-scale, `cores`"),
        ("a figure's age at the gate, p99 ÷ refresh interval",
         f"{scale['p99_vs_refresh']:.1f}", "at-scale, `p99_vs_refresh`"),
        (f"events into HBM residency, {fleet} at full prefill",
         f"{cores['one collector: events into HBM residency']:.2f} core",
         "cost, `projection.cores`"),
        (f"eviction rates, {fleet} and {rates['replicas']} replicas",
         f"{rates['cores']:.3f} core", "evictions, `cores`"),
    ]
    rows = ["| figure | value | fleet-state-…-2026-12-05.json, key |", "|---|---:|---|"]
    rows += [f"| {label} | {value} | {key} |" for label, value, key in figures]
    return "\n".join(rows)


# The gate with the pool's or the engines' holdings known: (scenario, run without, run with the
# pool's holdings, run with HBM residency); "" where that run is not committed.
RESIDENCY = (
    ("bank-coding", "simulate-bank-coding", "simulate-residency-bank-coding",
     "simulate-hbm-residency-bank-coding"),
    ("pool of 1× the fleet's HBM", "simulate-small-pool-bank-coding",
     "simulate-residency-small-pool-bank-coding", "simulate-hbm-residency-small-pool-bank-coding"),
    ("pool down 10 min", "simulate-pool-fail-bank-coding",
     "simulate-residency-pool-fail-bank-coding", ""),
    ("agentic-coding, 960 sessions", "simulate-agentic-coding-960",
     "simulate-residency-agentic-coding-960", "simulate-hbm-residency-agentic-coding-960"),
    ("agentic-coding, 1,440 sessions", "load/agentic-coding-1440", "",
     "simulate-hbm-residency-agentic-coding-1440"),
    ("agentic-coding, 1,920 sessions", "load/agentic-coding-1920", "",
     "simulate-hbm-residency-agentic-coding-1920"),
    ("bank-coding, 12,800 sessions", "load/bank-coding-12800", "",
     "simulate-hbm-residency-bank-coding-12800"),
)


def kvgate(name: str) -> dict[str, Any] | None:
    figures: dict[str, Any] | None = load(name)["modes"]["affinity+ddr"] if name else None
    return figures


def residency_table() -> str:
    """kvgate's TTFT p99 and DDR read per request without and with each residency."""
    rows = ["| run | kvgate p99: without / pool holdings / HBM residency | prefix-score p99 | "
            "kvgate DDR read per request: without / pool holdings / HBM residency | "
            "prefix-score DDR read |", "|---|---:|---:|---:|---:|"]
    for scenario, base, pool, hbm in RESIDENCY:
        runs = [kvgate(base), kvgate(pool), kvgate(hbm)]
        peer = load(base)["modes"]["prefix-score"]
        p99 = " / ".join("–" if r is None else secs(r["ttft_p99_s"]) for r in runs)
        ddr = " / ".join("–" if r is None else gb(r["ddr_bytes_per_request_mean"]) for r in runs)
        rows.append(f"| {scenario} | {p99} | {secs(peer['ttft_p99_s'])} | {ddr} | "
                    f"{gb(peer['ddr_bytes_per_request_mean'])} |")
    return "\n".join(rows)


def seeds_table() -> str:
    """agentic-coding at 960 sessions under workload seeds 0-3, with and without HBM residency."""
    rows = ["| seed | `affinity+ddr` | with HBM residency | `sticky+ddr` | prefix-score | "
            "residency ÷ prefix-score | p99: residency / prefix-score |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for seed in range(4):
        plain, hbm = (("simulate-agentic-coding-960", "simulate-hbm-residency-agentic-coding-960")
                      if seed == 0 else (f"seeds/agentic-coding-960-seed-{seed}",
                                         f"seeds/hbm-residency-agentic-coding-960-seed-{seed}"))
        modes, with_hbm = load(plain)["modes"], load(hbm)["modes"]["affinity+ddr"]
        peer = modes["prefix-score"]
        ratio = with_hbm["ddr_bytes_per_request_mean"] / peer["ddr_bytes_per_request_mean"]
        rows.append(
            f"| {seed} | {gb(modes['affinity+ddr']['ddr_bytes_per_request_mean'])} | "
            f"{gb(with_hbm['ddr_bytes_per_request_mean'])} | "
            f"{gb(modes['sticky+ddr']['ddr_bytes_per_request_mean'])} | "
            f"{gb(peer['ddr_bytes_per_request_mean'])} | {ratio:.2f}× | "
            f"{secs(with_hbm['ttft_p99_s'])} / {secs(peer['ttft_p99_s'])} |")
    return "\n".join(rows)


# The P/D runs (docs/results/pd/pd-P-D-NAME.json): (NAME, what it is).
PD_RUNS = (
    ("bank-coding", "bank-coding, 3,200 sessions"),
    ("bank-coding-6400", "bank-coding, 6,400 sessions (2×)"),
    ("agentic-coding", "agentic-coding, 480 sessions"),
    ("agentic-coding-960", "agentic-coding, 960 sessions (2×)"),
    ("mooncake-trace", "Mooncake conversation trace"),
)
PD_SPLITS = ("4-12", "8-8")
PD_MODES = ("pd-kvgate", "pd-vllm-ascend", "pd-llm-d", "pd-dynamo")


def pd_table() -> str:
    """TTFT p99 and inter-token p99 of colocated kvgate and each P/D policy, on 16 devices."""

    def cell(f: dict[str, Any]) -> str:
        return f"{f['ttft_p99_s']:.1f} s · {1000 * f['itl_p99_s']:.0f} ms"

    rows = ["| run | P:D | `affinity+ddr` (colocated) | " + " | ".join(
        f"`{m}`" for m in PD_MODES) + " | `pd-kvgate` skips prefill | `pd-kvgate`, every turn "
        "remote | `pd-kvgate`, `skip_rule: streams` (skips) |",
        "|---|---|---:|" + "---:|" * len(PD_MODES) + "---:|---:|---:|"]
    for name, what in PD_RUNS:
        for split in PD_SPLITS:
            modes = load(f"pd/pd-{split}-{name}")["modes"]
            remote = load(f"pd/pd-{split}-{name}-skip-0")["modes"]["pd-kvgate"]
            streams = load(f"pd/pd-{split}-{name}-streams")["modes"]["pd-kvgate"]
            rows.append(f"| {what} | {split.replace('-', ':')} | {cell(modes['affinity+ddr'])} | "
                        + " | ".join(cell(modes[m]) for m in PD_MODES)
                        + f" | {pct(modes['pd-kvgate']['prefill_skipped_share'])} | "
                        f"{cell(remote)} | {cell(streams)} "
                        f"({pct(streams['prefill_skipped_share'])}) |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {
    "pd": pd_table,
    "sweep": sweep_table,
    "scenarios": scenarios_table,
    "plans": plans_table,
    "real-vs-sim": real_vs_sim_table,
    "fleet-state": fleet_state_table,
    "residency": residency_table,
    "seeds": seeds_table,
}


def rendered(name: str) -> str:
    return TABLES[name]() if name in TABLES else table(name)


def render(text: str) -> str:
    return BLOCK.sub(lambda m: f"<!-- result: {m['name']} -->\n{rendered(m['name'])}\n"
                               "<!-- /result -->", text)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    stale = []
    for doc in documents():
        if doc.is_relative_to(RESULTS):
            continue
        text = doc.read_text()
        new = render(text)
        if new != text:
            stale.append(doc.relative_to(ROOT).as_posix())
            if not check:
                doc.write_text(new)
    if check and stale:
        print("render_results: not what docs/results renders: " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
