"""`placement.load_gate` and `placement.engine_cost` in the YAML."""

from __future__ import annotations

import pytest

from kvgate.config import ConfigError, load_text
from kvgate.config.dump import to_yaml
from kvgate.config.load import check_text
from kvgate.config.sections.placement import GateConfig
from kvgate.placement.cost import EngineCost

POOLS = "pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"


def test_defaults_are_the_gate_and_the_cost_model_defaults() -> None:
    placement = load_text(POOLS).placement
    assert placement.load_gate == GateConfig()
    assert placement.load_gate.enabled
    assert placement.engine_cost == EngineCost()


def test_the_load_source_is_scrape_unless_told_and_its_collectors_are_addresses() -> None:
    gate = load_text(POOLS).placement.load_gate
    assert (gate.source, gate.collector) == ("scrape", ())
    gate = load_text(POOLS + "placement: {load_gate: {source: collector, collector: "
                     "[cp-0.kvgate:18001, 'http://10.0.0.5:18001']}}\n").placement.load_gate
    assert gate.source == "collector"
    assert [str(a) for a in gate.collector] == ["cp-0.kvgate:18001", "10.0.0.5:18001"]
    with pytest.raises(ConfigError) as caught:
        load_text(POOLS + "placement: {load_gate: {source: etcd, collector: [nowhere]}}\n")
    assert "placement.load_gate.source: must be one of scrape, collector, got 'etcd'" \
        in str(caught.value)
    assert "placement.load_gate.collector[0]: must be host:port" in str(caught.value)


def test_kv_events_are_one_port_or_an_offset_and_need_the_collector() -> None:
    gate = load_text(POOLS + "placement: {load_gate: {source: collector, kv_events_port: 5557}}\n"
                     ).placement.load_gate
    assert (gate.kv_events_port, gate.kv_events_port_offset) == (5557, 0)
    gate = load_text(POOLS + "placement: {load_gate: {source: collector, "
                     "kv_events_port_offset: -100}}\n").placement.load_gate
    assert (gate.kv_events_port, gate.kv_events_port_offset) == (0, -100)
    gate = load_text(POOLS + "placement: {load_gate: {source: collector, "
                     "kv_events_port: 5557, kv_events_replay_offset: 1}}\n").placement.load_gate
    assert gate.kv_events_replay_offset == 1
    for text, expected in (
        ("{source: collector, kv_events_port: 5557, kv_events_port_offset: 1}",
         "placement.load_gate.kv_events_port_offset: set kv_events_port or"),
        ("{kv_events_port: 5557}",
         "placement.load_gate.kv_events_port: KV events are read by the collector: needs "
         "source: collector, got source: scrape"),
        ("{source: collector, kv_events_port: 70000}", "placement.load_gate.kv_events_port"),
        ("{source: collector, kv_events_replay_offset: 1}",
         "placement.load_gate.kv_events_replay_offset: a replay socket belongs to an event "
         "publisher"),
    ):
        with pytest.raises(ConfigError) as caught:
            load_text(POOLS + f"placement: {{load_gate: {text}}}\n")
        assert expected in str(caught.value)


def test_a_collector_reached_through_a_wildcard_admin_address_is_warned() -> None:
    wildcard = "control_plane: {admin: 0.0.0.0:18001}\n"
    collector = "placement: {load_gate: {source: collector}}\n"
    warned = [str(w) for w in check_text(POOLS + wildcard + collector).warnings]
    assert any("placement.load_gate.collector: empty, so ext_proc replicas ask "
               "control_plane.admin (0.0.0.0:18001)" in w for w in warned), warned
    named = "placement: {load_gate: {source: collector, collector: [cp:18001]}}\n"
    for fine in (POOLS + wildcard + named, POOLS + collector):
        assert not any("load_gate" in str(w) for w in check_text(fine).warnings)


def test_every_key_is_read_and_survives_the_round_trip() -> None:
    config = load_text(POOLS + """placement:
  load_factor: 1.5
  load_gate:
    enabled: false
    min_saving_s: 250ms
    min_saving_ratio: 0.2
    cooldown_s: 1m
    candidates: 3
    miss_safe: false
    refresh_s: 50ms
    max_load_age_s: 1s
    bytes_per_token: 3.5
  engine_cost:
    prefill_tokens_per_s: 100000
    prefill_overhead_s: 1ms
    kv_bytes_per_token: 128KiB
    ddr_gbps: 400
    transfer_fixed_ms: 0.15
    prompt_us_per_token: 5.8
""")
    gate, cost = config.placement.load_gate, config.placement.engine_cost
    assert (gate.enabled, gate.min_saving_s, gate.min_saving_ratio, gate.cooldown_s,
            gate.candidates, gate.miss_safe) == (False, 0.25, 0.2, 60.0, 3, False)
    assert (gate.refresh_s, gate.max_load_age_s, gate.bytes_per_token) == (0.05, 1.0, 3.5)
    assert cost == EngineCost(100_000.0, 0.001, 128 * 1024, 400.0, 0.00015, 5.8 / 1e6)
    assert load_text(to_yaml(config)) == config  # what kvgate up hands its services


@pytest.mark.parametrize(("text", "expected"), [
    ("placement: {load_gate: {enable: false}}",
     "placement.load_gate.enable: unknown key (allowed here: enabled, min_saving_s"),
    ("placement: {engine_cost: {prefill_rate: 5}}",
     "placement.engine_cost.prefill_rate: unknown key (allowed here: prefill_tokens_per_s"),
    ("placement: {load_gate: {enabled: maybe}}",
     "placement.load_gate.enabled: must be true or false, got 'maybe'"),
    ("placement: {load_gate: {min_saving_ratio: 1.5}}",
     "placement.load_gate.min_saving_ratio: must be between 0.0 and 1.0, got 1.5"),
    ("placement: {load_gate: {candidates: 0}}",
     "placement.load_gate.candidates: must be 1..1024, got 0"),
    ("placement: {load_gate: {refresh_s: 1ms}}",
     "placement.load_gate.refresh_s: must be between 0.01s and 60s, got '1ms'"),
    ("placement: {load_gate: {refresh_s: 2s, max_load_age_s: 1s}}",
     "placement.load_gate.max_load_age_s: must be at least refresh_s (2s), got 1s"),
    ("placement: {load_gate: {bytes_per_token: 0}}",
     "placement.load_gate.bytes_per_token: must be between 0.1 and 1000.0, got 0"),
    ("placement: {engine_cost: {ddr_gbps: 0}}",
     "placement.engine_cost.ddr_gbps: must be between 0.001 and 1000000.0, got 0"),
    ("placement: {engine_cost: {kv_bytes_per_token: lots}}",
     "placement.engine_cost.kv_bytes_per_token: must be a size like 512KiB"),
    ("placement: {engine_cost: {prefill_overhead_s: -1}}",
     "placement.engine_cost.prefill_overhead_s: must be between 0s and 600s, got -1"),
    ("placement: {load_gate: [enabled]}", "placement.load_gate: must be a mapping, got a list"),
])
def test_bad_values_name_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(POOLS + text + "\n")
    assert expected in str(caught.value)


def test_several_engines_on_one_host_at_one_kv_events_port_are_warned_about() -> None:
    gate = "placement: {load_gate: {source: collector, kv_events_port: 5557}}\n"
    checked = check_text("pools: [{name: p, endpoints: [10.0.0.1:8000, 10.0.0.1:8001, "
                         "10.0.0.2:8000]}]\n" + gate)
    (warning,) = [str(w) for w in checked.warnings]
    assert warning.startswith("line 2: placement.load_gate.kv_events_port: engines 10.0.0.1:8000, "
                              "10.0.0.1:8001 share host 10.0.0.1: all would be read from one "
                              "stream, tcp://10.0.0.1:5557, so the collector reads none")
    assert "kv_events_port_offset" in warning
    assert check_text("pools: [{name: p, endpoints: [10.0.0.1:8000, 10.0.0.2:8000]}]\n"
                      + gate).warnings == ()
    offset = "placement: {load_gate: {source: collector, kv_events_port_offset: 100}}\n"
    assert check_text("pools: [{name: p, endpoints: [10.0.0.1:8000, 10.0.0.1:8001]}]\n"
                      + offset).warnings == ()
