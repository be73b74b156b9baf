"""What an engine does in a prefill/decode split (`role: both|prefill|decode`), as the config,
discovery's records and `kvgate register` name it. String-valued: YAML and records hold these
words."""

from __future__ import annotations

from enum import StrEnum


class EngineRole(StrEnum):
    BOTH = "both"  # prefills and decodes (no split; the default)
    PREFILL = "prefill"
    DECODE = "decode"
