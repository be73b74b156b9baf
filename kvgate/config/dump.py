"""Config → YAML in the documented shape: what `kvgate up` hands to the services it starts.

Every key the schema declares is written (kvgate.config.schema.dump_section), so reading the
dump gives the same Config back (tests/unit/test_config_round_trip.py)."""

from __future__ import annotations

from typing import Any

import yaml

from kvgate.config.model import Config
from kvgate.config.schema import dump_section


def to_dict(config: Config) -> dict[str, Any]:
    return dump_section(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
