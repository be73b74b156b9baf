"""The DDR pool under each connector profile, on hand-built sequences: what reaches the pool, what
a lookup refreshes, leases and watermarks; and the emulator's pool (over HTTP, behind real
instances) holding what the simulator's would for the same requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import aiohttp
import pytest

from emulator.clock import EmulatedClock
from emulator.ddr_pool import DdrPool
from emulator.engine_model import EngineModel
from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from emulator.pool_profiles import PROFILES, by_name

BS = 128
ALL = sorted(PROFILES)


def _pool(profile: str, blocks: int, high: float | None = None,
          low: float | None = None) -> DdrPool:
    return DdrPool(blocks * BS, BS, profile, high, low)


def _engine() -> EngineModel:
    return EngineModel(EmulatorOptions(block_size=BS, hbm_tokens=10_000 * BS,
                                       time_scale=0).engine_config())


def _turn(engine: EngineModel, pool: DdrPool, tokens: Sequence[int], now: float = 0.0,
          max_tokens: int = 1, answer: Sequence[int] = ()) -> tuple[int, int]:
    """One request as the simulator runs it: lookup, admit, store at the first token, finish.
    Returns (HBM, DDR) hit blocks."""
    probe = engine.probe(now, tokens)
    ddr = pool.lookup(probe.pool_hashes, probe.hbm_blocks, now)
    hashes = engine.output_hashes(tokens, probe, answer) if answer else ()
    admission = engine.admit(now, probe, max_tokens, ddr, hashes)
    pool.store(admission.to_pool, admission.hbm_blocks, admission.ddr_blocks, now)
    engine.finish(admission)
    pool.finish(admission.to_pool, admission.answer, admission.hbm_blocks, admission.ddr_blocks,
                now)
    return admission.hbm_blocks, admission.ddr_blocks


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [seed * 1_000_003 + i for i in range(n)]


@pytest.mark.parametrize("profile", ALL)
def test_a_previous_answers_blocks_reach_the_pool_by_the_next_turn(profile: str) -> None:
    engine, pool = _engine(), _pool(profile, 10_000)
    first = _tokens(4 * BS + 10)
    answer = _tokens(3 * BS, seed=7)
    _turn(engine, pool, first, max_tokens=len(answer), answer=answer)
    # The next turn resends the answer: HBM holds it (the engine cached its decode blocks).
    second = [*first, *answer, *_tokens(BS + 5, seed=9)]
    hbm, _ = _turn(engine, pool, second)
    assert hbm >= 7  # a sticky turn: the answer came from HBM
    # Every full block of the second prompt is in the pool now (whole chunks for LMCache).
    held = engine.hashes(second)
    full = len(held) - len(held) % pool.chunk
    assert all(h in pool for h in held[:full])
    # The store put only what was missing: the first prompt's blocks were there already.
    assert pool.inserted_blocks == full


def _hbm_hit_then_pressure(profile: str) -> tuple[list[int], list[int], DdrPool]:
    """Session A's 4 blocks, then B's 4, fill a pool of 8 that evicts only when full; A runs
    again entirely from HBM; then 2 new blocks need room. Returns A's and B's blocks."""
    pool = _pool(profile, 8, high=1.0, low=1.0)
    engine_a, engine_b = _engine(), _engine()
    a, b = _tokens(4 * BS + 1, seed=1), _tokens(4 * BS + 1, seed=2)
    _turn(engine_a, pool, a, now=0.0)
    _turn(engine_b, pool, b, now=1.0)
    hbm, ddr = _turn(engine_a, pool, a, now=2.0)  # sticky: HBM hits all four blocks
    assert (hbm, ddr) == (4, 0)
    pool.insert([101, 102], now=20.0)  # full: 2 must go (after every lease ran out)
    return engine_a.hashes(a), engine_b.hashes(b), pool


@pytest.mark.parametrize(("profile", "refreshed"), [
    ("lmcache", True),  # the whole-prompt lookup touches every hit, HBM hits included
    ("mooncake", True),  # the whole-prompt existence check leases A's blocks again
    ("vllm-offload", True),  # A's blocks were offered to store: refreshed at A's end
    ("ascend-store", False),  # nothing was read from the pool: MemCache's LRU saw no access
])
def test_an_hbm_hit_refreshes_the_pool_as_the_profile_says(profile: str,
                                                           refreshed: bool) -> None:
    a, b, pool = _hbm_hit_then_pressure(profile)
    gone = [h for h in (*a, *b) if h not in pool]
    assert len(gone) == 2
    # Refreshed, A is younger than B and B's oldest go; else A's own go first.
    assert set(gone) <= set(b if refreshed else a)


def test_lmcache_evicts_a_chains_tail_before_its_head() -> None:
    pool = _pool("lmcache", 4, high=1.0, low=1.0)
    pool.insert([1, 2, 3, 4])
    assert pool.lookup([1, 2, 3, 4]) == 4  # touched tail first: 1 ends most recently used
    pool.insert([5])
    assert 4 not in pool and 1 in pool


def test_a_lease_protects_a_block_until_it_runs_out() -> None:
    profile = by_name("mooncake")
    pool = _pool("mooncake", 10)  # 90 %: past 9 blocks it evicts, at least 5 % of them
    pool.insert(range(9), now=0.0)
    assert pool.lookup(list(range(9)), now=0.0) == 9  # every block leased until 10 s
    pool.insert([9], now=1.0)
    # Past the mark: the only block without a live lease goes, though it is the newest.
    assert 9 not in pool and len(pool) == 9 and pool.evictions == 1
    pool.insert([9], now=profile.lease_s + 1)  # the leases ran out: the oldest go first
    assert 0 not in pool and 1 not in pool and 9 in pool and len(pool) == 8


def test_a_lease_is_granted_past_the_first_miss_and_by_the_store_check() -> None:
    pool = _pool("mooncake", 100)
    pool.insert([1, 3], now=0.0)
    assert pool.lookup([1, 2, 3], now=5.0) == 1  # the hit ends at 2; 3 is leased all the same
    assert pool.keys() == [1, 3]
    pool.insert(range(10, 95), now=6.0)  # fresh puts sort by write time, before both leases
    assert pool.keys()[-2:] == [1, 3]
    pool.store([10, 50], now=7.0)  # the existence check leases 10 and 50
    assert pool.keys()[-2:] == [10, 50]


@pytest.mark.parametrize(("profile", "held_after"), [
    ("ascend-store", 80),  # past 90 % down to 80 % (MemCache's thresholds, assumed)
    ("mooncake", 85),  # past 90 %: ceil(91 x (0.01 + 0.05)) = 6 of 91 objects go
    ("lmcache", 91),  # only when full
    ("vllm-offload", 91),
])
def test_eviction_starts_and_stops_where_the_profile_says(profile: str, held_after: int) -> None:
    pool = _pool(profile, 100)
    pool.insert(range(90))
    assert len(pool) == 90 and pool.evictions == 0
    pool.insert([90])
    assert len(pool) == held_after
    pool.insert(range(1000, 1100))
    assert len(pool) <= 100


def test_lmcache_looks_up_and_stores_whole_256_token_chunks() -> None:
    pool = _pool("lmcache", 100)
    assert pool.chunk == 2  # 256-token chunks of 128-token blocks
    assert pool.store([1, 2, 3]) == 2  # the last, partial chunk is not stored
    assert 3 not in pool
    pool.insert([3])
    assert pool.lookup([1, 2, 3, 4]) == 2  # 3 alone is half a chunk: no hit


@pytest.mark.parametrize(("profile", "served"), [
    ("ascend-store", 0), ("lmcache", 0), ("mooncake", 0),  # from the first block: a miss there
    ("vllm-offload", 2),  # from the HBM hit on
])
def test_where_a_lookup_starts(profile: str, served: int) -> None:
    pool = _pool(profile, 100)
    pool.insert([2, 3, 4, 5])  # the pool lost the chain's first two blocks; HBM holds them
    assert pool.lookup([0, 1, 2, 3], skip=2) == served


def test_vllm_offload_stores_past_a_load_and_refreshes_what_it_used_at_the_end() -> None:
    pool = _pool("vllm-offload", 100)
    pool.insert([2, 3, 50])
    assert pool.lookup([0, 1, 2, 3, 4, 5], skip=2) == 2  # 2 and 3 loaded
    assert pool.store([0, 1, 2, 3, 4, 5], hbm_blocks=2, ddr_blocks=2) == 2  # 4, 5: not 0, 1
    assert 0 not in pool and 1 not in pool
    pool.finish([0, 1, 2, 3, 4, 5], [], hbm_blocks=2, ddr_blocks=2)
    assert pool.keys() == [50, 5, 4, 3, 2]  # used ones refreshed, the head last


class _FixedClock(EmulatedClock):
    """Emulated time held at 0, so leases compare alike in both runs."""

    def __init__(self) -> None:
        super().__init__(0)

    def now(self) -> float:
        return 0.0


def _requests() -> list[tuple[int, list[int]]]:
    """(instance, prompt tokens): two sessions' turns, one moved to the other instance, a
    prompt the pool has seen the start of, and enough blocks to make the small pool evict."""
    a1 = _tokens(6 * BS + 3, seed=1)
    b1 = _tokens(5 * BS + 7, seed=2)
    a2 = [*a1, *_tokens(3 * BS, seed=3)]
    b2 = [*b1, *_tokens(4 * BS + 1, seed=4)]
    a3 = [*a2, *_tokens(2 * BS + 2, seed=5)]
    return [(0, a1), (1, b1), (0, a2), (1, b2), (1, a3), (0, b2), (0, _tokens(9 * BS, seed=6))]


@pytest.mark.parametrize("profile", ALL)
async def test_the_emulator_and_the_simulator_leave_the_same_pool(profile: str) -> None:
    options = EmulatorOptions(instances=1, block_size=BS, time_scale=0, pool_connector=profile,
                              ddr_tokens=24 * BS)
    # The simulator's way: the engine model and the pool model called directly.
    engines = [EngineModel(options.engine_config()) for _ in range(2)]
    expected = DdrPool(options.pool_tokens, BS, profile)
    for instance, tokens in _requests():
        _turn(engines[instance], expected, tokens)
    # The emulator's: real instances over HTTP, the first beside the pool (called in-process),
    # the second in a fleet of its own that reaches the pool over HTTP.
    host = Fleet(options)
    host.clock = _FixedClock()
    async with host:
        assert host.pool_url is not None and host.pool is not None
        joined = Fleet(replace(options, pool_url=host.pool_url))
        async with joined, aiohttp.ClientSession() as http:
            urls = [host.engines[0], joined.engines[0]]
            for instance, tokens in _requests():
                async with http.post(f"http://{urls[instance]}/v1/completions",
                                     json={"model": options.model, "prompt": tokens,
                                           "max_tokens": 1}) as resp:
                    assert resp.status == 200, await resp.text()
        assert host.pool.evictions > 0  # the sequence does make the pool evict
        assert host.pool.keys() == expected.keys()
        assert host.pool.stats() == expected.stats()


async def test_the_pool_service_refuses_a_bad_store_and_says_which_field() -> None:
    async with Fleet(EmulatorOptions(instances=1, time_scale=0)) as fleet, \
            aiohttp.ClientSession() as http:
        for body, field in (({"hashes": [1], "hbm_blocks": -1}, "hbm_blocks"),
                            ({"hashes": [1], "answer": ["x"]}, "answer"),
                            ({"hashes": "1"}, "hashes")):
            async with http.post(f"{fleet.pool_url}/v1/store", json=body) as resp:
                assert resp.status == 400
                assert field in (await resp.json())["error"]["message"]
        assert fleet.pool is not None and len(fleet.pool) == 0
