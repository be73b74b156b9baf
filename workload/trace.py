"""Mooncake-format trace replay: ``{"timestamp" ms, "input_length", "output_length",
"hash_ids"}`` per line. Block id b becomes a 512-token segment keyed by b, so two prompts share
exactly the blocks the trace says they share; the last block is cut to ``input_length``.

Sessions: a record's ``session_id`` or ``conversation_id`` when it has one; otherwise inferred
from the blocks (`workload.conversations`): a request continues the conversation whose latest
prompt it extends furthest beyond the prefix every request shares. Files may be gzip-compressed
(``.gz``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO, NamedTuple

from workload.conversations import ConversationIndex, shared_prefix_blocks
from workload.model import Request, Segment, Workload

TRACE_BLOCK_TOKENS = 512
SESSION_FIELDS = ("session_id", "conversation_id")


class _Record(NamedTuple):
    arrival: float
    line: int
    ids: list[int]
    input_length: int
    output_length: int
    session: str | None  # the record's own id, if any


def _record(record: object, line: int) -> _Record:
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
    session = next((record[f] for f in SESSION_FIELDS if record.get(f) not in (None, "")), None)
    if session is not None and (isinstance(session, bool) or not isinstance(session, str | int)):
        raise ValueError(f"line {line}: session_id/conversation_id must be a string or a number")
    return _Record(arrival, line, ids, n, out, None if session is None else str(session))


def _request(record: _Record, session: str) -> Request:
    chain: list[Segment] = []
    left = record.input_length
    for b in record.ids:
        if left <= 0:
            break
        take = min(TRACE_BLOCK_TOKENS, left)
        chain.append(Segment(b, take))
        left -= take
    if left > 0:  # longer than its blocks say: the rest is unique to this request
        chain.append(Segment(-record.line, left))
    return Request(record.arrival, session, chain, len(chain), record.output_length)


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def mooncake_trace(path: Path, limit: int | None = None) -> Workload:
    """Replay ``path`` (at most ``limit`` requests), sorted by arrival.

    Raises ValueError naming the file and line for anything that is not a trace record."""
    records: list[_Record] = []
    try:
        with _open(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {line_no}: not JSON ({exc.msg})") from None
                records.append(_record(record, line_no))
                if limit is not None and len(records) >= limit:
                    break
    except (OSError, EOFError) as exc:
        raise ValueError(f"trace {path}: {getattr(exc, 'strerror', None) or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"trace {path}: {exc}") from None
    if not records:
        raise ValueError(f"trace {path}: no requests")
    records.sort(key=lambda r: (r.arrival, r.line))
    shared = shared_prefix_blocks([r.ids for r in records])
    index = ConversationIndex(shared)
    requests = []
    for r in records:
        # Named after its first block beyond the shared prefix, as a person would point at it.
        hint = f"mooncake-{r.ids[min(shared, len(r.ids) - 1)]}"
        requests.append(_request(r, index.assign(r.ids, r.session, hint)))
    explicit = sum(1 for r in records if r.session is not None)
    describe = {"name": "mooncake-trace", "trace": path.name, "requests": len(requests),
                "block_tokens": TRACE_BLOCK_TOKENS, "shared_prefix_blocks": shared,
                "sessions": index.conversations,
                "sessions_from": ("record ids" if explicit == len(records) else
                                  "inferred" if explicit == 0 else "record ids + inferred")}
    return Workload("mooncake-trace", requests, describe)
