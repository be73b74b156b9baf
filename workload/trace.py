"""Mooncake-format trace replay: ``{"timestamp" ms, "input_length", "output_length",
"hash_ids"}`` per line. Block id b becomes a 512-token segment keyed by b, so two prompts share
exactly the blocks the trace says they share; the last block is cut to ``input_length``.
``hash_ids[1]`` (the first block after the shared system prompt) is the session id.
"""

from __future__ import annotations

import json
from pathlib import Path

from workload.model import Request, Segment, Workload

TRACE_BLOCK_TOKENS = 512


def _request(record: dict[str, object], line: int) -> Request:
    try:
        ids = [int(b) for b in record["hash_ids"]]  # type: ignore[union-attr]
        n = int(record["input_length"])  # type: ignore[call-overload]
        arrival = float(record["timestamp"]) / 1000.0  # type: ignore[arg-type]
        out = max(1, int(record["output_length"]))  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"trace line {line}: {exc!r}") from exc
    if not ids or n <= 0:
        raise ValueError(f"trace line {line}: empty hash_ids or input_length")
    chain: list[Segment] = []
    left = n
    for b in ids:
        if left <= 0:
            break
        take = min(TRACE_BLOCK_TOKENS, left)
        chain.append(Segment(b, take))
        left -= take
    if left > 0:  # longer than its blocks say: the rest is unique to this request
        chain.append(Segment(-line, left))
    session = f"mooncake-{ids[1] if len(ids) > 1 else ids[0]}"
    return Request(arrival, session, chain, len(chain), out)


def mooncake_trace(path: Path, limit: int | None = None) -> Workload:
    """Replay ``path`` (at most ``limit`` requests), sorted by arrival."""
    requests: list[Request] = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            requests.append(_request(json.loads(line), line_no))
            if limit is not None and len(requests) >= limit:
                break
    requests.sort(key=lambda r: r.arrival)
    describe = {"name": "mooncake-trace", "trace": path.name, "requests": len(requests),
                "block_tokens": TRACE_BLOCK_TOKENS}
    return Workload("mooncake-trace", requests, describe)
