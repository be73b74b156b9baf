"""Which test tiers a run selects: the default run spreads over the CPUs, some tiers must not."""

from __future__ import annotations

import re

# Tiers that load a whole machine on purpose (faults under traffic, timed recoveries) or need
# gigabytes per engine (real vLLM): a run that selects one goes serial, whatever `-n` the default
# options ask for.
SERIAL_TIERS = ("chaos", "real_vllm", "open_fault")


def selects_serial_tier(markexpr: str) -> bool:
    """Whether a `-m` expression names a serial tier other than to leave it out ("not chaos")."""
    return any(re.search(rf"(?<!not )\b{tier}\b", markexpr) for tier in SERIAL_TIERS)
