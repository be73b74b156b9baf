"""The real-engine tier's shared pool without vLLM: the index client against kvgate's real pool
service, the block files and their collection, the call log, and the engine flags that attach
the connector (real_vllm/pool_store.py, real_vllm/shared_pool.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from real_vllm.fleet import EngineOptions
from real_vllm.pool_store import BlockFiles, CallLog, PoolIndex, block_key, hex_keys, read_calls
from real_vllm.shared_pool import REPO_ROOT, SharedPool


@pytest.mark.asyncio
async def test_the_index_speaks_the_pool_services_api_and_held_refreshes_nothing() -> None:
    # vllm-offload: one block per key, LRU only when full, lookups refresh nothing.
    async with SharedPool("vllm-offload", capacity_blocks=3, block_size=16) as shared:
        index = PoolIndex(shared.url)
        assert await asyncio.to_thread(index.store, [1, 2, 3], 0, 0) == 3
        assert await asyncio.to_thread(index.held, [1, 9]) == {1}
        assert await asyncio.to_thread(index.lookup, [1, 2, 3], 1) == 2
        # held() did not make 1 recently used: the next put evicts it, the LRU head.
        assert await asyncio.to_thread(index.store, [4], 0, 0) == 1
        assert await asyncio.to_thread(index.held, [1, 2, 3, 4]) == {2, 3, 4}
        assert await asyncio.to_thread(index.finish, [2, 3], [5], 0, 0) == 0  # no decode
        assert shared.pool.keys() == [4, 3, 2]  # vllm-offload refreshes 2, 3 at the end, head last
        assert [r["reply"] for r in shared.served("/v1/lookup")] == [{"hits": 2}]
        assert shared.served("/v1/store")[0]["body"] == {"hashes": [1, 2, 3], "hbm_blocks": 0,
                                                         "ddr_blocks": 0}


@pytest.mark.asyncio
async def test_held_rejects_bad_input_and_names_the_field() -> None:
    async with SharedPool("ascend-store", capacity_blocks=4) as shared, \
            aiohttp.ClientSession() as http:
        async with http.post(f"{shared.url}/v1/held", json={"hashes": ["x"]}) as reply:
            assert reply.status == 400
            assert "hashes" in (await reply.json())["error"]["message"]
        async with http.post(f"{shared.url}/v1/held", json={"hashes": [7]}) as reply:
            assert reply.status == 200 and await reply.json() == {"held": []}


@pytest.mark.asyncio
async def test_block_files_are_collected_once_the_pool_evicts_their_keys(tmp_path: Path) -> None:
    async with SharedPool("vllm-offload", capacity_blocks=2, block_size=16) as shared:
        index = PoolIndex(shared.url)
        files = BlockFiles(tmp_path / "blocks")

        def put(keys: list[int]) -> int:
            with files.locked():
                for key in keys:
                    files.write(key, key.to_bytes(8, "big"))
                index.store(keys, 0, 0)
                return files.collect_garbage(index)

        assert await asyncio.to_thread(put, [1, 2]) == 0
        assert files.write(1, b"other") is False  # a block's file is written once
        assert await asyncio.to_thread(put, [3]) == 1  # 1 evicted, its file gone
        assert sorted(files.keys()) == [2, 3]
        assert files.read(1) is None and files.read(3) == (3).to_bytes(8, "big")
        assert not list(files.root.glob("*.part"))


def test_keys_are_the_first_8_bytes_of_vllms_sha256_block_hash_and_logged_as_hex(
        tmp_path: Path) -> None:
    digest = bytes(range(32))
    assert block_key(digest) == int.from_bytes(digest[:8], "big")
    assert block_key(-1) == 2**64 - 1
    assert hex_keys([255]) == ["00000000000000ff"]
    log = CallLog(tmp_path / "calls.jsonl", "0/scheduler")
    log.write("lookup", keys=hex_keys([1]), hbm_hit_blocks=0)
    log.write("store", inserted=1)
    calls = read_calls(tmp_path / "calls.jsonl")
    assert [(c["engine"], c["call"]) for c in calls] == [("0/scheduler", "lookup"),
                                                         ("0/scheduler", "store")]
    CallLog(None, "x").write("lookup")  # no path: nothing written, nothing raised
    assert read_calls(tmp_path / "none.jsonl") == []


@pytest.mark.asyncio
async def test_engine_options_attach_the_connector_with_one_hash_on_every_engine() -> None:
    async with SharedPool("lmcache", capacity_blocks=8) as shared:
        options = shared.engine_options(EngineOptions(extra_args=("--seed", "1")))
        args = list(options.extra_args)
        assert args[:2] == ["--seed", "1"]
        assert args[args.index("--prefix-caching-hash-algo") + 1] == "sha256"
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert config["kv_connector_module_path"] == "real_vllm.pool_connector"
        assert config["kv_connector_extra_config"]["pool_url"] == shared.url
        assert options.python_path == str(REPO_ROOT)
        directory = shared.directory
        assert directory.is_dir()
    assert not directory.exists()  # stopped: the block directory is removed
