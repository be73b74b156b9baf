"""bench/new_session_latency.py: the config it starts ext_proc with is a valid one, Envoy's
message is what ext_proc decides on, and a histogram's quantile is read from what it gathered
between two pages (not since the process started)."""

from __future__ import annotations

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench import new_session_latency as bench
from ext_proc.server import decision_inputs
from kvgate.config import load_text


def _page(counts: dict[str, int]) -> str:
    lines = ["# HELP d Decisions", "# TYPE d histogram"]
    lines += [f'd_bucket{{le="{le}"}} {n}' for le, n in counts.items()]
    lines += [f"d_count {counts['+Inf']}", "d_sum 0"]
    return "\n".join(lines) + "\n"


def test_the_quantile_is_of_what_was_gathered_between_two_pages() -> None:
    before = _page({"0.01": 1000, "0.1": 1000, "+Inf": 1000})
    after = _page({"0.01": 1010, "0.1": 1090, "+Inf": 1100})  # 100 more, 80 of them slow
    assert bench.gathered_quantile(before, after, "d", 0.5) == 0.1
    assert bench.gathered_quantile(before, after, "d", 0.05) == 0.01
    assert bench.gathered_quantile(before, before, "d", 0.5) != 0.1  # nothing gathered: nan


def test_the_config_loads_and_the_message_carries_the_session() -> None:
    ports = {"ext_proc": 10001, "metrics": 10002, "etcd": 10003}
    config = load_text(bench.config_text(ports, ["127.0.0.1:9001", "127.0.0.1:9002"], "5s"))
    assert config.ext_proc.message_timeout == 5.0 and config.ext_proc.etcd_write_budget == 1.0
    assert [e.kv_pool for e in config.pools[0].endpoints] == ["ddr-0", "ddr-1"]
    request = pb.ProcessingRequest.FromString(bench.headers_request("abc"))
    headers, body = decision_inputs(request)
    assert headers["x-session-id"] == b"abc" and body is None
