"""Helpers of the real-vLLM tier's tests (tests/real_vllm)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace

from kvgate.config.model import Config, Health
from tests.support.stack import gateway_config

UPSTREAM_HEADER = "x-kvgate-upstream"
# A loaded CPU answers /health slowly while it prefills: generous probes, still a fast verdict.
HEALTH = Health(interval=1.0, timeout=0.9, unhealthy_threshold=2, healthy_threshold=1)


def real_gateway_config(addresses: list[str], prefix: str) -> Config:
    config = gateway_config(addresses, prefix=prefix, kv_pool="cpu-a")
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
