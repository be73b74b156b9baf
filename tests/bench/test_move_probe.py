from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

# A tiny fleet under the relaxed gate (it moves sessions); the probe wraps classes in its own
# process, so each run is a subprocess.
FLAGS = ("--jobs", "1", "--quiet", "--modes", "affinity+ddr", "--no-oracle", "--workload",
         "agentic-coding", "--engines", "2", "--sessions", "12", "--duration-s", "300",
         "--ramp-s", "60", "--gate-miss-safe", "off", "--gate-min-saving-s", "0.2",
         "--gate-min-saving-ratio", "0.1", "--gate-cooldown-s", "0")


def _probe(tmp_path: Path, *own: str) -> tuple[dict, dict]:
    out = tmp_path / "probe.json"
    subprocess.run([sys.executable, "-m", "simulator.move_probe", str(out), *own, "--",
                    *FLAGS, "--out", str(tmp_path)], check=True, capture_output=True)
    simulated = json.loads((tmp_path / "simulate-agentic-coding.json").read_text())
    return json.loads(out.read_text()), simulated["modes"]["affinity+ddr"]


def test_the_probe_changes_nothing_and_splits_every_move(tmp_path: Path) -> None:
    probe, simulated = _probe(tmp_path, "--raw")
    # Its own rows give the run's measured requests and TTFT p99 exactly.
    assert probe["requests"] == simulated["requests"]
    assert probe["ttft_p99_s"] == simulated["ttft_p99_s"]
    moved = probe["moved"]["n"]
    assert moved > 0
    for split in ("moved_by_target_backlog", "moved_by_predicted_saving"):
        assert sum(part["n"] for part in probe[split]) == moved
    raw = json.loads((tmp_path / "probe.json.raw.json").read_text())
    decisions = raw["decisions"].values()
    assert sum(1 for d in decisions if d["moved"]) >= moved  # the warm-up's moves too
    assert all(d["went"] == d["best"] for d in decisions if d["moved"])
    kinds = {kind for kind, _ in raw["booked"].values()}
    assert "new" in kinds and kinds <= {"new", "kept", "same engine", "re-placed in its DDR pool"}
    assert probe["bias_s"] == {"move": 0.0, "stay": 0.0}  # measured only under --debias


def test_debias_hears_the_moves_first_tokens(tmp_path: Path) -> None:
    probe, simulated = _probe(tmp_path, "--debias")
    assert probe["ttft_p99_s"] == simulated["ttft_p99_s"]
    assert probe["moved"]["n"] > 0
    assert probe["bias_s"]["move"] != 0.0 and math.isfinite(probe["bias_s"]["move"])
