"""The emulator's pool: loads timed by the shared transfer model, and pool faults over HTTP."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from emulator.clock import EmulatedClock
from emulator.ddr_pool import DdrPool
from emulator.fleet import Fleet
from emulator.options import EmulatorOptions
from emulator.pool_faults import PoolFaults, PoolWindow
from emulator.pool_host import PoolHost, PoolUnavailable
from emulator.transfer import GB, TransferParams

BS = 16
KV = 1 << 20  # 1 MiB per token: 16 MiB per block


class _Clock(EmulatedClock):
    """Emulated time set by the test (time scale 0: nothing waits)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _host(clock: EmulatedClock, faults: PoolFaults | None = None) -> PoolHost:
    links = TransferParams(device_gbps=20, node_gbps=None, fixed_ms=0)
    return PoolHost(DdrPool(10_000 * BS, BS), links, faults or PoolFaults(), clock, KV)


async def test_concurrent_loads_to_one_device_share_its_link() -> None:
    host = _host(EmulatedClock(1.0))  # real time: the loads are still in flight when looked at
    host.insert(range(100))
    alone = 100 * BS * KV / (20 * GB)
    started = host.clock.now()
    loads = [asyncio.create_task(host.load(list(range(100)), device=0)) for _ in range(2)]
    try:
        await asyncio.sleep(0)  # both tasks run up to their wait for the transfer
        assert len(host.transfers) == 2
        # Both move at half the link: the first done after twice the time it would take alone.
        assert host.transfers.next_done() - started == pytest.approx(2 * alone, abs=0.05)
        assert host.transfers.estimate(host.clock.now(), 1, 100 * BS * KV) == pytest.approx(
            alone)  # another device's link is free
    finally:
        for load in loads:
            load.cancel()
        host.close()


async def test_a_load_returns_its_hits_once_moved_and_counts_the_bytes() -> None:
    host = _host(EmulatedClock(0.001))  # an emulated second per wall millisecond
    host.insert(range(50))
    hits = await asyncio.gather(host.load([0, 1, 2, 99], 0), host.load(list(range(50)), 3))
    assert hits == [3, 50]
    assert host.stats()["read_bytes"] == pytest.approx(53 * BS * KV)
    assert host.stats()["transfers_in_flight"] == 0
    host.close()


async def test_a_pool_down_refuses_then_comes_back_empty() -> None:
    clock = _Clock()
    host = _host(clock, PoolFaults([PoolWindow(10.0, 5.0)]))
    host.insert([1, 2, 3])
    clock.t = 12.0
    with pytest.raises(PoolUnavailable):
        host.lookup([1])
    with pytest.raises(PoolUnavailable):
        host.insert([4])
    clock.t = 15.0
    assert host.lookup([1, 2, 3]) == 0  # back, without what it held
    assert host.insert([4]) == 1 and host.lookup([4]) == 1
    assert host.stats()["refused"] == 2


async def test_engines_serve_from_hbm_while_the_pool_is_down() -> None:
    options = EmulatorOptions(instances=2, time_scale=0, pool_fail=(PoolWindow(0.0, 3600.0),))
    prompt = " ".join(f"word{i % 97}" for i in range(400))
    body = {"model": options.model, "prompt": prompt, "max_tokens": 4}
    async with Fleet(options) as fleet, aiohttp.ClientSession() as http:
        async with http.post(f"{fleet.pool_url}/v1/lookup", json={"hashes": [1]}) as resp:
            assert resp.status == 503
        a, b = fleet.engines
        for engine in (a, a, b):
            async with http.post(f"http://{engine}/v1/completions", json=body) as resp:
                assert resp.status == 200
                usage = (await resp.json())["usage"]
        # b never saw the prompt and the pool is down: a miss, not an error.
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert fleet.pool is not None and len(fleet.pool) == 0
        async with http.post(f"http://{a}/v1/completions", json=body) as resp:
            assert (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
