"""Put each committed result's table into the docs: every `<!-- result: NAME -->` ...
`<!-- /result -->` block of README.md and docs/*.md gets docs/results/NAME.md (or
docs/results/sweep/NAME.md) without its title, so the docs quote exactly what the documented
commands wrote. Run from the repository's root after regenerating results:
`python docs/render_results.py`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- result: (?P<name>[\w.-]+) -->\n.*?<!-- /result -->", re.S)


def table(name: str) -> str:
    for folder in (ROOT / "docs" / "results", ROOT / "docs" / "results" / "sweep"):
        path = folder / f"{name}.md"
        if path.exists():
            text = path.read_text()
            if text.startswith("# "):  # the title line
                text = text.split("\n", 1)[1].lstrip("\n")
            return text.rstrip("\n")
    raise SystemExit(f"render_results: no docs/results/{name}.md")


def sweep_table() -> str:
    """The sweep's runs (docs/results/sweep/sweep-ENGINES-SYSTEM.json), one row each."""
    import json

    rows = ["| engines | `--system-tokens` | round_robin hit rate | round_robin TTFT p99 | "
            "affinity+ddr hit rate | affinity+ddr TTFT p99 | oracle |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for engines in (16, 64, 256):
        for system in (1500, 1000, 500, 0):
            path = ROOT / "docs" / "results" / "sweep" / f"sweep-{engines}-{system}.json"
            doc = json.loads(path.read_text())
            rr, kv = doc["modes"]["round_robin"], doc["modes"]["affinity+ddr"]
            label = f"{system} (default)" if (engines, system) == (16, 1000) else str(system)
            rows.append(f"| {engines} | {label} | {100 * rr['hit_rate']:.1f} % | "
                        f"{rr['ttft_p99_s']:.0f} s | {100 * kv['hit_rate']:.1f} % | "
                        f"{kv['ttft_p99_s']:.1f} s | {100 * doc['oracle_hit_rate']:.1f} % |")
    return "\n".join(rows)


def render(text: str) -> str:
    return BLOCK.sub(lambda m: f"<!-- result: {m['name']} -->\n"
                               f"{sweep_table() if m['name'] == 'sweep' else table(m['name'])}\n"
                               "<!-- /result -->", text)


def main() -> int:
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        doc.write_text(render(doc.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
