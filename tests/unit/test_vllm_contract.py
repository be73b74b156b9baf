"""One vLLM metrics contract (kvgate.contract.vllm): the emulator writes every name kvgate's
readers ask for, and the one reader sums label sets, skips look-alikes, timestamps and help."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from emulator.engine_model import EngineConfig, EngineModel
from emulator.metrics import make_registry, render
from kvgate.contract import vllm

COUNTERS = (vllm.PREFIX_CACHE_QUERIES, vllm.PREFIX_CACHE_HITS,
            vllm.EXTERNAL_PREFIX_CACHE_QUERIES, vllm.EXTERNAL_PREFIX_CACHE_HITS,
            vllm.PROMPT_TOKENS, vllm.GENERATION_TOKENS, vllm.REQUEST_SUCCESS)
GAUGES = (vllm.NUM_REQUESTS_RUNNING, vllm.NUM_REQUESTS_WAITING, vllm.KV_CACHE_USAGE_PERC)


def test_the_emulator_exposes_every_name_the_readers_use() -> None:
    page = render(make_registry(EngineModel(EngineConfig(model="m", hbm_tokens=1024)),
                                lambda: 0.0)).decode()
    names = [vllm.total(c) for c in COUNTERS] + list(GAUGES) + [
        f"{vllm.TIME_TO_FIRST_TOKEN_SECONDS}_sum", f"{vllm.TIME_TO_FIRST_TOKEN_SECONDS}_count"]
    found = vllm.read_samples(page, names)
    assert set(found) == set(names)
    # The same figures as a full parse of the page.
    parsed = {s.name: s.value for f in text_string_to_metric_families(page) for s in f.samples}
    assert found == {name: parsed[name] for name in names}


def test_read_samples_sums_label_sets_and_reads_only_the_value() -> None:
    page = (
        "# HELP vllm:prefix_cache_hits Prefix cache hits.\n"
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="a"} 10.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="a {odd}"} 5.0 1700000000000\n'
        'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n'
        "vllm:num_requests_waiting 3\n"
        "vllm:num_requests_waiting_by_reason 100\n"
        "vllm:kv_cache_usage_perc{a=\"b\"} NaN\n"
        "vllm:num_requests_running{broken 1\n"
    )
    found = vllm.read_samples(page, [vllm.total(vllm.PREFIX_CACHE_HITS),
                                     vllm.NUM_REQUESTS_WAITING, vllm.NUM_REQUESTS_RUNNING])
    assert found == {"vllm:prefix_cache_hits_total": 15.0, "vllm:num_requests_waiting": 3.0}
    assert vllm.read_samples("", [vllm.NUM_REQUESTS_WAITING]) == {}
