"""The scale bounds in the YAML: session.max_bindings and ext_proc.max_pending_bindings."""

from __future__ import annotations

import pytest

from kvgate.config import ConfigError, load_text
from kvgate.config.dump import to_yaml

POOLS = "pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"


def test_defaults_and_round_trip() -> None:
    config = load_text(POOLS)
    assert config.session.max_bindings == 1_000_000
    assert config.ext_proc.max_pending_bindings == 100_000
    tuned = load_text(POOLS + "session: {max_bindings: 0}\next_proc: {max_pending_bindings: 5}\n")
    assert tuned.session.max_bindings == 0 and tuned.ext_proc.max_pending_bindings == 5
    assert load_text(to_yaml(tuned)) == tuned  # what kvgate up hands its services


@pytest.mark.parametrize(("text", "expected"), [
    ("session: {max_bindings: -1}", "line 2: session.max_bindings: must be 0..1000000000, got -1"),
    ("session: {max_bindings: lots}", "line 2: session.max_bindings: must be an integer"),
    ("ext_proc: {max_pending_bindings: 0}",
     "line 2: ext_proc.max_pending_bindings: must be 1..10000000, got 0"),
])
def test_bad_values_name_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(POOLS + text + "\n")
    assert expected in str(caught.value)
