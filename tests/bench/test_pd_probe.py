from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# A tiny P/D fleet (two prefill engines, two decode engines); the probe wraps classes in its own
# process, so each run is a subprocess.
FLAGS = ("--jobs", "1", "--quiet", "--modes", "pd-kvgate", "--no-oracle", "--workload",
         "agentic-coding", "--engines", "4", "--pd", "2:2", "--sessions", "12",
         "--duration-s", "300", "--ramp-s", "60", "--hbm-residency", "on")


def _probe(tmp_path: Path, *own: str) -> tuple[dict, dict]:
    out = tmp_path / "probe.json"
    subprocess.run([sys.executable, "-m", "simulator.pd_probe", str(out), *own, "--",
                    *FLAGS, "--out", str(tmp_path)], check=True, capture_output=True)
    simulated = json.loads((tmp_path / "simulate-agentic-coding.json").read_text())
    return json.loads(out.read_text()), simulated["modes"]["pd-kvgate"]


def test_the_probe_changes_nothing_and_splits_every_turn(tmp_path: Path) -> None:
    probe, simulated = _probe(tmp_path)
    # Its own rows give the run's measured turns, TTFT p99 and skipped share exactly.
    assert probe["turns"] == simulated["requests"]
    assert probe["all"]["ttft_p99_s"] == round(simulated["ttft_p99_s"], 3)
    assert probe["skipped_share"] == simulated["prefill_skipped_share"]
    paths = probe["paths"]
    assert paths["remote"]["n"] > 0 and paths["skipped"]["n"] > 0
    assert paths["remote"]["n"] + paths["skipped"]["n"] == probe["turns"]
    # A skipped turn never waits for a prefill engine; a remote one computes its last token.
    assert paths["skipped"]["prefill_wait_s"] == 0.0 and paths["skipped"]["pull_s"] == 0.0
    assert paths["remote"]["decode_computed_mean"] > 0
    assert sum(e["n"] for e in probe["prefill_engines"].values()) == paths["remote"]["n"]
    assert sum(b["n"] for b in probe["queue_estimates"]) == paths["remote"]["n"]
    assert set(probe["windows"]) == {"prefill", "decode"}


def test_an_oracle_pick_still_counts_every_turn(tmp_path: Path) -> None:
    probe, simulated = _probe(tmp_path, "--oracle-pick")
    assert probe["turns"] == simulated["requests"]
    assert probe["all"]["ttft_p99_s"] == round(simulated["ttft_p99_s"], 3)
