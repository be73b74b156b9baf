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


def _request(record: object, line: int) -> Request:
    if not isinstance(record, dict):
        raise ValueError(f"line {line}: expected a JSON object, got {type(record).__name__}")
    try:
        ids = [int(b) for b in record["hash_ids"]]
        n = int(record["input_length"])
        arrival = float(record["timestamp"]) / 1000.0
        out = max(1, int(record["output_length"]))
    except KeyError as exc:
        raise ValueError(f"line {line}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"line {line}: {exc}") from None
    if not ids or n <= 0:
        raise ValueError(f"line {line}: empty hash_ids or input_length <= 0")
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
    """Replay ``path`` (at most ``limit`` requests), sorted by arrival.

    Raises ValueError naming the file and line for anything that is not a trace record."""
    requests: list[Request] = []
    try:
        with path.open() as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {line_no}: not JSON ({exc.msg})") from None
                requests.append(_request(record, line_no))
                if limit is not None and len(requests) >= limit:
                    break
    except OSError as exc:
        raise ValueError(f"trace {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"trace {path}: {exc}") from None
    if not requests:
        raise ValueError(f"trace {path}: no requests")
    requests.sort(key=lambda r: r.arrival)
    describe = {"name": "mooncake-trace", "trace": path.name, "requests": len(requests),
                "block_tokens": TRACE_BLOCK_TOKENS}
    return Workload("mooncake-trace", requests, describe)
