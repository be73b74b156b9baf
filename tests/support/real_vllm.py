"""Helpers of the real-vLLM tier's tests (tests/real_vllm)."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx

from kvgate.config.model import Config, Health
from real_vllm.fleet import EngineOptions, RealFleet, default_cores
from real_vllm.install import cache_root, ensure_installed
from real_vllm.model import ensure_model
from stack.local import Stack
from tests.support.stack import gateway_config

UPSTREAM_HEADER = "x-kvgate-upstream"
# A loaded CPU answers /health slowly while it prefills: generous probes, still a fast verdict.
HEALTH = Health(interval=1.0, timeout=0.9, unhealthy_threshold=2, healthy_threshold=1)


def real_gateway_config(addresses: list[str], prefix: str) -> Config:
    config = gateway_config(addresses, prefix=prefix, kv_pool="cpu-a")
    pools = tuple(replace(p, health=HEALTH) for p in config.pools)
    return replace(config, pools=pools, upstream_header=UPSTREAM_HEADER)


def pd_gateway_config(prefill: str, decode: str, prefix: str,
                      skip_prefill_below: int) -> Config:
    """One prefill and one decode engine in a P/D pool (disaggregation.skip_prefill_below)."""
    config = gateway_config([{"address": prefill, "role": "prefill"},
                             {"address": decode, "role": "decode"}], prefix=prefix,
                            kv_pool="cpu-a",
                            extra={"disaggregation": {"skip_prefill_below": skip_prefill_below}})
    pools = tuple(replace(p, health=HEALTH) for p in config.pools)
    return replace(config, pools=pools, upstream_header=UPSTREAM_HEADER)


async def kvgate(*args: str) -> tuple[int, str]:
    """The kvgate command as a user runs it: exit code and standard output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvgate_cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode()


@asynccontextmanager
async def real_engines(instances: int, options: EngineOptions, name: str,
                       scratch: Path) -> AsyncIterator[RealFleet]:
    """``instances`` real engines, each on its own core, logs and pid files under the run's
    directory (``name`` a subdirectory; tests/real_vllm/run.sh stops what is left there), or
    under ``scratch`` outside run.sh; stopped on the way out."""
    env = await asyncio.to_thread(ensure_installed)
    model = await asyncio.to_thread(ensure_model, env, cache_root())
    run_dir = os.environ.get("KVGATE_REAL_VLLM_RUN_DIR")
    workdir = (Path(run_dir) / name if name else Path(run_dir)) if run_dir else scratch
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    fleet = RealFleet(env, model, instances, workdir, cache_root(), options,
                      default_cores(instances))
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()


async def up_and_empty(fleet: RealFleet) -> RealFleet:
    """Every engine up (one a test killed is started again) and its prefix cache emptied
    (vLLM's dev-mode endpoint)."""
    async with httpx.AsyncClient(timeout=30) as http:
        for engine in fleet.engines:
            if not engine.child.running:
                await fleet.restart(engine)
            reply = await http.post(f"{engine.url}/reset_prefix_cache")
            assert reply.status_code == 200, reply.text
    return fleet


@asynccontextmanager
async def gateway_for(fleet: RealFleet, workdir: Path) -> AsyncIterator[Stack]:
    """kvgate (etcd, control plane, ext_proc, Envoy) in front of ``fleet``'s engines."""
    prefix = f"/kvgate/real-{uuid.uuid4().hex[:8]}/"
    stack = Stack(real_gateway_config(fleet.addresses, prefix), workdir / "stack")
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()
