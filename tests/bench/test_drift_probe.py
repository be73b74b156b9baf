from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from simulator.drift_probe import _leading, attribution, overtaken

# A tiny fleet under the relaxed gate (it moves sessions); the probe wraps classes in its own
# process, so each run is a subprocess.
FLAGS = ("--jobs", "1", "--quiet", "--modes", "affinity+ddr", "--no-oracle", "--workload",
         "agentic-coding", "--engines", "2", "--sessions", "12", "--duration-s", "300",
         "--ramp-s", "60", "--gate-miss-safe", "off", "--gate-min-saving-s", "0.2",
         "--gate-min-saving-ratio", "0.1", "--gate-cooldown-s", "0")
PLAIN = ("import argparse, sys; from simulator.command import add_arguments, run; "
         "p = argparse.ArgumentParser(); add_arguments(p); "
         "sys.exit(run(p.parse_args(sys.argv[1:])))")


def _simulated(out: Path) -> dict[str, Any]:
    result = json.loads((out / "simulate-agentic-coding.json").read_text())
    return dict(result["modes"]["affinity+ddr"])


def test_the_probe_changes_nothing_and_books_every_request(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    (tmp_path / "plain").mkdir()
    out = tmp_path / "drift.json"
    subprocess.run([sys.executable, "-m", "simulator.drift_probe", str(out), "--raw", "--",
                    *FLAGS, "--out", str(tmp_path / "probe")], check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", PLAIN, *FLAGS, "--out", str(tmp_path / "plain")],
                   check=True, capture_output=True)
    probed, plain = _simulated(tmp_path / "probe"), _simulated(tmp_path / "plain")
    assert probed["ttft_p99_s"] == plain["ttft_p99_s"]
    assert probed["ddr_bytes_per_request_mean"] == plain["ddr_bytes_per_request_mean"]
    summary = json.loads(out.read_text())
    rows = json.loads((tmp_path / "drift.json.raw.json").read_text())
    kinds = summary["by_kind"]
    assert kinds["new"]["n"] == 12  # each session's first turn
    assert kinds["moved"]["n"] > 0 and kinds["kept"]["n"] > 0
    assert sum(k["n"] for k in kinds.values()) == summary["all"]["n"] == len(rows)
    assert [r["seq"] for r in sorted(rows, key=lambda r: r["seq"])] == list(
        range(1, len(rows) + 1))
    for row in rows:  # the causes add up to what the engine computed beyond the booking
        causes = attribution(row)
        assert (causes["estimate"] + causes["reuse"] + causes["lost"]
                == row["computed"] - row["uncached"])
        assert row["computed"] + row["hbm"] + row["ddr"] == row["tokens"]


def test_leading_counts_only_an_unbroken_prefix_up_to_the_limit() -> None:
    assert _leading([1, 2, 3, 4], 4, {1, 2}, {3}) == 3
    assert _leading([1, 2, 3, 4], 2, {1, 2, 3, 4}) == 2
    assert _leading([1, 2, 3], 3, {2, 3}) == 0


def _row(seq: int, engine: int, t: float, read: float, wait: float, prefill: float
         ) -> dict[str, Any]:
    return {"seq": seq, "engine": engine, "t": t, "real_read_s": read, "real_wait_s": wait,
            "real_prefill_s": prefill}


def test_overtaken_counts_later_bookings_that_started_first() -> None:
    # Booked first with a 0.1 s read: admitted at 10.1, prefilled at 10.9, after two requests
    # booked after it at 10.0 (0.5 s and 0.3 s); one booked at 10.2 came after its admission.
    moved = _row(1, 0, 10.0, 0.1, 0.8, 0.4)
    rows = [moved, _row(2, 0, 10.0, 0.0, 0.0, 0.5), _row(3, 0, 10.0, 0.0, 0.5, 0.3),
            _row(4, 0, 10.2, 0.0, 1.1, 0.2), _row(5, 1, 10.0, 0.0, 0.0, 9.0)]
    overtaken(rows)
    assert moved["overtaken_s"] == 0.8
    assert all(r["overtaken_s"] == 0.0 for r in rows[1:])


def test_a_true_board_reads_the_engines_real_queue(tmp_path: Path) -> None:
    out = tmp_path / "drift.json"
    subprocess.run([sys.executable, "-m", "simulator.drift_probe", str(out), "--raw",
                    "--true-board", "--keep-place", "--", *FLAGS, "--out", str(tmp_path)],
                   check=True, capture_output=True)
    rows = json.loads((tmp_path / "drift.json.raw.json").read_text())
    unread = [r for r in rows if r["real_read_s"] == 0]
    assert len(unread) > len(rows) / 2
    # Sent with nothing to read, a request waits exactly the queue the board gave the gate.
    assert all(abs(r["real_wait_s"] - r["backlog_s"]) < 1e-9 for r in unread)
    assert any(r["real_wait_s"] > 0 for r in unread)
