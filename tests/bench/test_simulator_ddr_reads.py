"""Where a simulated mode's DDR reads come from (simulator/ddr_reads.py), and the per-request reads
it is counted from (SimResult.ddr_tokens)."""

from __future__ import annotations

import re

import pytest

from emulator.options import EmulatorOptions
from kvgate.contract.modes import RoutingMode
from simulator import ddr_reads
from simulator.run import SimConfig, simulate
from workload.bank import BankCodingOptions, bank_coding


def test_each_requests_ddr_read_is_the_one_the_figures_count() -> None:
    workload = bank_coding(BankCodingOptions(sessions=120, duration_s=600, ramp_s=0))
    workload.warmup_s = 60
    result = simulate(workload, RoutingMode.ROUND_ROBIN_DDR,
                      SimConfig(EmulatorOptions(instances=4, block_size=128)))
    measured = [t for r, t in zip(workload.requests, result.ddr_tokens, strict=True)
                if workload.measured(r)]
    assert result.stats.ddr_reads is not None
    assert sorted(measured) == sorted(result.stats.ddr_reads)
    assert sum(measured) > 0  # round robin over a pool reads from it


def test_the_breakdown_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert ddr_reads.main(["round_robin+ddr", "--engines", "4", "--sessions", "120",
                           "--duration-s", "600", "--no-oracle"]) == 0
    out = capsys.readouterr().out
    total = float(re.search(r": ([\d.]+)M tokens read", out).group(1))  # type: ignore[union-attr]
    parts = [float(m) for m in re.findall(r"(?m)^\s+[a-z ]+:\s+([\d.]+)M tokens over", out)]
    engines = [float(t) for t in out.rsplit("(M tokens): ", 1)[1].split(", ")]
    assert len(parts) == 3 and len(engines) == 4
    assert total > 0
    assert sum(parts) == pytest.approx(total, abs=0.15)
    assert sum(engines) == pytest.approx(total, abs=0.25)
    assert ddr_reads.main([]) == 2  # no mode: the usage, not a traceback
