"""The pure model layer against hand-worked examples (no I/O, no clock)."""

from __future__ import annotations

import inspect

import pytest

from emulator import engine_model as engine_model_module
from emulator.ddr_pool import DdrPool
from emulator.engine_model import Admission, EngineConfig, EngineModel
from emulator.prefix_cache import PrefixCache, block_hashes, max_hit_blocks, root_hash
from emulator.steps import StepScheduler
from emulator.timing import Scheduler, TimingParams
from emulator.tokenize import Tokenizer, render_chat

BS = 16


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


# ---- tokenizer and template -----------------------------------------------------------------


def test_tokenizer_is_deterministic_local_and_about_four_chars_per_token() -> None:
    text = inspect.getsource(engine_model_module)
    a, b = Tokenizer(), Tokenizer()
    ids = a.encode(text)
    assert ids == b.encode(text)
    assert 3.0 <= len(text) / len(ids) <= 5.0
    # An edit near the end leaves the tokens of everything well before it unchanged.
    edited = a.encode(text[:-200] + "CHANGED" + text[-200:])
    same = next(i for i, (x, y) in enumerate(zip(ids, edited, strict=False)) if x != y)
    assert same >= len(ids) - 80


def test_chat_render_of_a_longer_conversation_extends_the_shorter_one() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
    r1, r2 = render_chat(turn1), render_chat(turn2)
    assert r2.startswith(r1.removesuffix("<|im_start|>assistant\n"))
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert "ab" in render_chat(parts)
    with pytest.raises(ValueError):
        render_chat([{"content": "no role"}])


# ---- hashes and the hit rule ------------------------------------------------------------------


def test_only_full_blocks_are_hashed_and_the_chain_covers_the_parent() -> None:
    assert block_hashes(toks(15), BS) == []
    assert len(block_hashes(toks(33), BS)) == 2
    base = block_hashes(toks(48), BS)
    # A change in block 2 keeps blocks 0 and 1; a change in block 0 changes every block.
    late = toks(48)
    late[40] = 999
    assert block_hashes(late, BS)[:2] == base[:2] and block_hashes(late, BS)[2] != base[2]
    early = toks(48)
    early[0] = 999
    assert all(x != y for x, y in zip(block_hashes(early, BS), base, strict=True))
    # Same tokens at a different position (different parent) hash differently.
    repeated = block_hashes([7] * 32, BS)
    assert repeated[0] != repeated[1]
    assert block_hashes(toks(32), BS, root_hash("m1", BS)) != block_hashes(
        toks(32), BS, root_hash("m2", BS)
    )


@pytest.mark.parametrize(
    ("n", "expected"), [(1, 0), (16, 0), (17, 1), (32, 1), (33, 2), (40, 2), (48, 2), (49, 3)]
)
def test_n_minus_one_cap_in_blocks(n: int, expected: int) -> None:
    assert max_hit_blocks(n, BS) == expected


def model(hbm_tokens: int = 10_000) -> EngineModel:
    return EngineModel(EngineConfig(model="m", block_size=BS, hbm_tokens=hbm_tokens))


def run(
    m: EngineModel, tokens: list[int], ddr: int | None = None, max_tokens: int = 1
) -> Admission:
    admission = m.admit(0.0, m.probe(0.0, tokens), max_tokens, ddr)
    m.finish(admission)
    return admission


def test_repeat_hits_full_blocks_only_and_keeps_one_token_to_compute() -> None:
    m = model()
    first = run(m, toks(40))
    assert (first.cached_tokens, len(first.to_pool)) == (0, 2)
    assert run(m, toks(40)).hbm_hit_tokens == 32  # partial block (8 tokens) recomputed
    # Exactly two blocks: the n-1 rule leaves the whole second block to compute.
    run(m, toks(32, 1000))
    again = run(m, toks(32, 1000))
    assert again.hbm_hit_tokens == 16
    # The pool is offered every full prompt block; the first came from HBM.
    assert again.to_pool == again.hashes[:2] and again.hbm_blocks == 1
    assert m.stats.prefix_cache_queries == 40 + 40 + 32 + 32
    assert m.stats.prefix_cache_hits == 32 + 16


def test_divergence_in_the_middle_of_a_prompt_hits_the_blocks_before_it() -> None:
    m = model()
    run(m, toks(64))
    b = toks(64)
    b[40] = 5  # inside block 2 (tokens 32..47)
    assert run(m, b).hbm_hit_tokens == 32
    c = toks(64)
    c[32] = 5  # first token of block 2
    assert run(m, c).hbm_hit_tokens == 32
    d = toks(64)
    d[31] = 5  # last token of block 1
    assert run(m, d).hbm_hit_tokens == 16


def test_the_answer_is_cached_and_the_next_prompt_that_resends_it_hits_it() -> None:
    m = model()
    prompt, answer = toks(40), toks(30, 5000)  # blocks: 0-15, 16-31, then 32..69 runs on
    probe = m.probe(0.0, prompt)
    cached = m.output_hashes(prompt, probe, answer)
    # Prompt + answer without its last token = 69 tokens: full blocks 2 and 3 hold answer tokens.
    assert cached == block_hashes([*prompt, *answer], BS, m.root)[2:4]
    m.finish(m.admit(0.0, probe, len(answer), None, cached))
    follow_up = [*prompt, *answer, *toks(20, 9000)]
    assert run(m, follow_up).hbm_hit_tokens == 64  # 40 prompt + 24 answer tokens, whole blocks
    # A caller that does not pass the answer's blocks caches the prompt's two full blocks only.
    other = model()
    run(other, prompt, max_tokens=len(answer))
    assert run(other, follow_up).hbm_hit_tokens == 32


# ---- eviction ---------------------------------------------------------------------------------


def test_lru_evicts_least_recent_and_a_prompts_tail_first() -> None:
    cache = PrefixCache(capacity_tokens=4 * BS, block_size=BS)
    a, b, c = ([x + 1, x + 2] for x in (10, 20, 30))
    for blocks in (a, b):
        cache.acquire(blocks)
        cache.release(blocks)
    # Freed tail first: a request's last block is evicted before its first.
    assert cache.free_order() == [a[1], a[0], b[1], b[0]]
    cache.acquire(a)  # a is used again: now most recent
    cache.release(a)
    assert cache.free_order() == [b[1], b[0], a[1], a[0]]
    cache.acquire([c[0]])
    assert b[1] not in cache and b[0] in cache  # one block needed, b's tail went first
    cache.acquire([c[1]])
    assert b[0] not in cache and all(h in cache for h in a)
    assert cache.evictions == 2


def test_blocks_held_by_running_requests_are_not_evicted() -> None:
    cache = PrefixCache(capacity_tokens=2 * BS, block_size=BS)
    held, other = [1, 2], [3, 4]
    cache.acquire(held)
    cache.acquire(other)  # over capacity: nothing free to evict, capacity is soft
    assert all(h in cache for h in held + other)
    assert cache.usage() == 1.0
    cache.release(other)
    assert all(h in cache for h in held) and not any(h in cache for h in other)
    cache.release(held)
    assert all(h in cache for h in held) and cache.usage() == 0.0


def test_reserved_decode_blocks_count_toward_capacity_and_usage() -> None:
    m = model(hbm_tokens=10 * BS)
    adm = m.admit(0.0, m.probe(0.0, toks(40)), max_tokens=40, ddr_hit_blocks=None)
    # 40 prompt + 40 output tokens = 5 blocks: 2 cached full blocks + 3 reserved.
    assert adm.extra_blocks == 3 and m.usage(0.0) == pytest.approx(0.5)
    # Held until the last token by the schedule, or until the caller finishes it early.
    assert m.usage(adm.slot.finish - 1e-6) == pytest.approx(0.5)
    assert m.usage(adm.slot.finish) == 0.0 and len(m.cache) == 2
    early = m.admit(10.0, m.probe(10.0, toks(40)), max_tokens=40, ddr_hit_blocks=None)
    assert m.usage(10.0) == pytest.approx(0.5)
    m.finish(early)  # the client went away
    assert m.usage(10.0) == 0.0
    assert m.usage(early.slot.finish) == 0.0  # and the schedule does not unpin it twice


def test_waiting_requests_hold_no_blocks_and_are_looked_up_when_they_start() -> None:
    # A burst far beyond one engine's speed: each request waits for the serial prefill stage.
    m = EngineModel(EngineConfig(model="m", block_size=BS, hbm_tokens=8 * BS,
                                 timing=TimingParams(prefill_tokens_per_s=1000)))  # fmt: skip
    prompts = [toks(3 * BS + 1, 1000 * i) for i in range(30)]
    last = None
    for prompt in prompts:
        last = m.admit(0.0, m.probe(0.0, prompt), max_tokens=1)
        # Only the prefilling request (none queued behind it) holds blocks: within capacity.
        assert len(m.cache) + m.cache.reserved_blocks <= m.cache.capacity_blocks
    assert last is not None
    # The next arrival is looked up as of its own prefill start, after the whole burst: the
    # first prompts are gone, the last one (done by then) is cached.
    probe = m.probe(0.0, prompts[-1])
    assert probe.prefill_start == last.slot.first_token and probe.hbm_blocks == 3
    assert m.probe(0.0, prompts[0]).hbm_blocks == 0


# ---- DDR pool ---------------------------------------------------------------------------------


def test_ddr_pool_counts_leading_hits_and_evicts_lru() -> None:
    pool = DdrPool(capacity_tokens=3 * BS, block_size=BS, high=1.0, low=1.0)  # plain LRU
    assert pool.insert([1, 2, 3]) == 3
    assert pool.lookup([1, 2, 9, 3]) == 2  # stops at the first miss
    pool.insert([4])  # 3 was least recently used (1 and 2 were touched by the lookup)
    assert 3 not in pool and len(pool) == 3
    assert pool.lookup([4, 1, 2]) == 3
    assert pool.stats()["evictions"] == 1


def test_ddr_pool_evicts_from_the_high_to_the_low_watermark() -> None:
    pool = DdrPool(capacity_tokens=100 * BS, block_size=BS)  # MemCache's 90 % / 80 %
    pool.insert(range(90))
    assert len(pool) == 90 and pool.evictions == 0  # at the high watermark, not past it
    pool.lookup([0, 1])  # 0 and 1 are now the most recently used
    pool.insert([1000])  # past 90 %: least recently used go until 80 % is held
    assert len(pool) == 80 and pool.evictions == 11
    assert 0 in pool and 1 in pool and 1000 in pool and 2 not in pool and 12 not in pool
    assert 13 in pool
    pool.clear()
    assert len(pool) == 0 and pool.lookup([1000]) == 0
    with pytest.raises(ValueError, match="watermarks"):
        DdrPool(100, BS, high=0.7, low=0.8)


def test_engine_on_a_sibling_hits_the_pool_after_its_own_hbm() -> None:
    pool = DdrPool(capacity_tokens=1000 * BS, block_size=BS)
    a, b = model(), model()
    prompt = toks(100)  # 6 full blocks, cap 6 (99 // 16)
    adm = run(a, prompt, ddr=pool.lookup(a.probe(0.0, prompt).ddr_candidates))
    pool.store(adm.to_pool, adm.hbm_blocks, adm.ddr_blocks)
    assert len(pool) == 6
    run(b, toks(40), ddr=0)  # b has the first 2 blocks in HBM already
    probe = b.probe(0.0, prompt)
    assert probe.hbm_blocks == 2 and probe.ddr_candidates == probe.hashes[2:6]
    adm_b = run(b, prompt, ddr=pool.lookup(probe.ddr_candidates))
    assert (adm_b.hbm_hit_tokens, adm_b.ddr_hit_tokens, adm_b.cached_tokens) == (32, 64, 96)
    assert pool.store(adm_b.to_pool, adm_b.hbm_blocks, adm_b.ddr_blocks) == 0  # all held
    assert b.stats.external_prefix_cache_hits == 64
    assert b.stats.external_prefix_cache_queries == 40 + 100
    no_pool = model()
    run(no_pool, prompt)
    assert no_pool.stats.external_prefix_cache_queries == 0


# ---- timing -----------------------------------------------------------------------------------


def test_prefill_time_formula() -> None:
    t = TimingParams(prefill_tokens_per_s=5000, prefill_overhead_s=0.02,
                     kv_bytes_per_token=256 * 1024, ddr_bytes_per_s=20e9)  # fmt: skip
    assert t.prefill_seconds(5000, 0) == pytest.approx(1.02)
    assert t.prefill_seconds(0, 10_000) == pytest.approx(0.02 + 10_000 * 262_144 / 20e9)
    assert TimingParams(decode_s_per_token=0.035).decode_seconds(11) == pytest.approx(0.35)


def test_the_whole_prompt_is_charged_per_token_cached_or_not() -> None:
    t = TimingParams(prefill_tokens_per_s=5000, prefill_overhead_s=0.01,
                     prompt_s_per_token=6e-6)
    # 64 new tokens on a 3,072-token cached prefix: the prefix's tokens are tokenized, hashed
    # and looked up too (vLLM's renderer and block hasher), so they cost their 6 µs each.
    assert t.prefill_seconds(64, 0, prompt_tokens=3136) == pytest.approx(
        0.01 + 3136 * 6e-6 + 64 / 5000)
    assert t.prefill_seconds(64, 0) == pytest.approx(0.01 + 64 / 5000)  # no prompt, no charge
    steps = StepScheduler(TimingParams(prefill_tokens_per_s=5000, prefill_overhead_s=0.01,
                                       decode_s_per_token=0.012, prompt_s_per_token=6e-6))
    lone = steps.schedule(0.0, 64, 1, prompt_tokens=3136)
    # entry (API server + the prompt's work), then one step: its fixed cost and 64 tokens
    step_s = 0.012 - 1 / 5000
    assert lone.ttft == pytest.approx(0.01 + 3136 * 6e-6 + step_s + 64 / 5000)


def test_a_warm_turn_on_the_engine_pays_for_its_whole_prompt() -> None:
    def ttft(per_token_s: float) -> float:
        model = EngineModel(EngineConfig(block_size=16, hbm_tokens=16_000, timing=TimingParams(
            prefill_tokens_per_s=5000, prefill_overhead_s=0.0, prompt_s_per_token=per_token_s)))
        prompt = list(range(1600))
        model.finish(model.admit(0.0, model.probe(0.0, prompt), 1))
        return model.admit(10.0, model.probe(10.0, [*prompt, *range(2000, 2032)]), 1).slot.ttft

    assert ttft(1e-5) - ttft(0.0) == pytest.approx(1632 * 1e-5)


def test_scheduler_queues_for_slots_and_serialises_prefill() -> None:
    one = Scheduler(max_num_seqs=1)
    s1 = one.schedule(0.0, prefill_s=1.0, decode_s=2.0)
    s2 = one.schedule(0.5, prefill_s=1.0, decode_s=2.0)
    assert (s1.first_token, s1.finish) == (1.0, 3.0)
    assert (s2.start, s2.first_token, s2.ttft) == (3.0, 4.0, 3.5)
    assert one.occupancy(1.0) == (1, 1)
    assert one.occupancy(3.5) == (1, 0)
    assert one.occupancy(7.0) == (0, 0)
    two = Scheduler(max_num_seqs=2)
    a = two.schedule(0.0, 1.0, 5.0)
    b = two.schedule(0.0, 1.0, 5.0)
    assert (a.start, b.start) == (0.0, 0.0)
    assert b.prefill_start == a.first_token == 1.0 and b.queue_wait == 1.0


def test_engine_ttft_includes_queue_and_histogram_counts() -> None:
    m = EngineModel(EngineConfig(model="m", block_size=BS, hbm_tokens=10_000,
                                 timing=TimingParams(prefill_tokens_per_s=1000,
                                                     prefill_overhead_s=0.0)))  # fmt: skip
    first = m.admit(0.0, m.probe(0.0, toks(100)), 1)
    second = m.admit(0.0, m.probe(0.0, toks(100, 500)), 1)
    assert first.slot.ttft == pytest.approx(0.1)
    assert second.slot.ttft == pytest.approx(0.2)  # waited for the first prefill
    assert m.stats.ttft.count == 2 and m.stats.ttft.total == pytest.approx(0.3)


def test_scheduler_state_stays_bounded_without_scrapes() -> None:
    s = Scheduler(max_num_seqs=4)
    for i in range(10_000):
        s.schedule(float(i), prefill_s=0.1, decode_s=0.5)
    assert len(s._not_finished) <= 2 and len(s._not_started) <= 1
    assert s.occupancy(10_000.0) == (0, 0)


def test_ddr_pool_memory_per_block_fits_one_million_in_250_mb() -> None:
    import random
    import tracemalloc

    hashes = [random.getrandbits(64) for _ in range(100_000)]
    tracemalloc.start()
    pool = DdrPool(capacity_tokens=len(hashes) * BS, block_size=BS)
    pool.insert(hashes)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_block = traced / len(hashes) + 32  # + the int object itself, allocated before tracing
    assert per_block * 1_000_000 < 250e6
