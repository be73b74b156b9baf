"""Mooncake-format trace replay: ``{"timestamp" ms, "input_length", "output_length",
"hash_ids"}`` per line. Block id b becomes a segment of ``block_tokens`` tokens (512, Mooncake's;
Alibaba's Qwen/Bailian traces use 16) keyed by b, so two prompts share exactly the blocks the
trace says they share; the last block is cut to ``input_length``. A record whose number of ids
does not fit ``input_length`` at that block size is refused (`BLOCK_COUNT_SLACK`).

Sessions: a record's ``session_id`` or ``conversation_id`` when it has one; otherwise inferred
from the blocks (`workload.conversations`): a request continues the conversation whose latest
prompt it extends furthest beyond its family's template, if that conversation's latest request
could have been answered by then (`earliest_answer`). Files may be gzip-compressed (``.gz``).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import IO, NamedTuple

from workload.conversations import ConversationIndex, family_templates, shared_prefix_blocks
from workload.model import Request, Segment, Workload

TRACE_BLOCK_TOKENS = 512
# How far a record's number of ids may be from ceil(input_length / block_tokens). The Mooncake
# conversation trace is exact on all 12,031 records; one id either way leaves room for a tool
# that drops a partial last block or counts one more token, and still refuses every prompt over
# 32 tokens read at the wrong one of 16 and 512 (ids off by 2 or more; Mooncake's shortest
# prompt has 891 tokens).
BLOCK_COUNT_SLACK = 1
# The earliest a request can be answered: the emulated engine's prefill with no queue
# (DESIGN.md's Qwen2.5-32B-class device; emulator/timing.py TimingParams' defaults, which a test
# holds these to: workload sits beside the emulator, not above it).
PREFILL_OVERHEAD_S = 0.020
PREFILL_TOKENS_PER_S = 5_000.0
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


def _check_blocks(record: _Record, block_tokens: int) -> None:
    need = -(-record.input_length // block_tokens)
    if abs(len(record.ids) - need) <= BLOCK_COUNT_SLACK:
        return
    # Block sizes are powers of two; of those that fit exactly, the nearest to 512.
    fits = [1 << k for k in range(21) if -(-record.input_length // (1 << k)) == len(record.ids)]
    size = min(fits, key=lambda b: abs(math.log2(b / TRACE_BLOCK_TOKENS)), default=0)
    hint = (f"the ids look like {size}-token blocks: --trace-block-tokens {size}" if size
            else f"about {record.input_length / len(record.ids):,.0f} tokens an id")
    raise ValueError(
        f"line {record.line}: {len(record.ids):,} hash_ids for {record.input_length:,} input "
        f"tokens do not fit {block_tokens}-token blocks (those make {need:,}); {hint}")


def earliest_answer(arrival: float, uncached_tokens: int) -> float:
    """The earliest a request's first token can come: the emulator's prefill of the tokens no
    cache can have held, with no queue (emulator/timing.py TimingParams.prefill_seconds: c0 +
    tokens / prefill rate, 20 ms + 1 s per 5,000 tokens). The next turn of its conversation
    resends the answer, so it cannot come sooner. Its decode is left out: at the emulator's
    35 ms a token it would refuse 26 of the 3,931 continuations the blocks show in the Mooncake
    trace (answers there came at 25-31 ms a token); the prefill refuses none. Trace timestamps
    are taken as exact."""
    return arrival + PREFILL_OVERHEAD_S + max(0, uncached_tokens) / PREFILL_TOKENS_PER_S


def _request(record: _Record, session: str, block_tokens: int) -> Request:
    chain: list[Segment] = []
    left = record.input_length
    for b in record.ids:
        if left <= 0:
            break
        take = min(block_tokens, left)
        chain.append(Segment(b, take))
        left -= take
    if left > 0:  # longer than its blocks say: the rest is unique to this request
        chain.append(Segment(-record.line, left))
    return Request(record.arrival, session, chain, len(chain), record.output_length)


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _read(path: Path, limit: int | None, block_tokens: int) -> list[_Record]:
    records: list[_Record] = []
    with _open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {line_no}: not JSON ({exc.msg})") from None
            records.append(_record(record, line_no))
            _check_blocks(records[-1], block_tokens)
            if limit is not None and len(records) >= limit:
                break
    return records


def mooncake_trace(path: Path, limit: int | None = None,
                   block_tokens: int = TRACE_BLOCK_TOKENS) -> Workload:
    """Replay ``path`` (at most ``limit`` requests), sorted by arrival; its ``hash_ids`` are
    blocks of ``block_tokens`` tokens.

    Raises ValueError naming the file and line for anything that is not a trace record."""
    if block_tokens < 1:
        raise ValueError(f"trace {path}: block tokens must be >= 1, got {block_tokens}")
    try:
        records = _read(path, limit, block_tokens)
    except (OSError, EOFError) as exc:
        raise ValueError(f"trace {path}: {getattr(exc, 'strerror', None) or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"trace {path}: {exc}") from None
    if not records:
        raise ValueError(f"trace {path}: no requests")
    records.sort(key=lambda r: (r.arrival, r.line))
    index = ConversationIndex(family_templates([r.ids for r in records]))
    requests = []
    answer: dict[str, int] = {}  # conversation -> its latest answer's tokens
    for r in records:
        # Named after its first block beyond its family's template, as a person would point.
        hint = f"mooncake-{r.ids[min(index.template(r.ids), len(r.ids) - 1)]}"
        held = index.held(r.ids)
        session = index.assign(r.ids, r.session, hint, r.arrival)
        # What no cache can hold: past the blocks an earlier prompt had, the next block (its
        # start may be an earlier prompt's partial block) and the previous answer (an engine
        # keeps the KV it generates).
        uncached = r.input_length - block_tokens * (held + 1) - answer.get(session, 0)
        index.busy_until(session, earliest_answer(r.arrival, uncached))
        answer[session] = r.output_length
        requests.append(_request(r, session, block_tokens))
    explicit = sum(1 for r in records if r.session is not None)
    describe = {"name": "mooncake-trace", "trace": path.name, "requests": len(requests),
                "block_tokens": block_tokens,
                "shared_prefix_blocks": shared_prefix_blocks([r.ids for r in records]),
                "families": len({r.ids[0] for r in records}),
                "sessions": index.conversations, "continuations": index.continuations,
                "too_early": index.too_early,
                "sessions_from": ("record ids" if explicit == len(records) else
                                  "inferred" if explicit == 0 else "record ids + inferred")}
    return Workload("mooncake-trace", requests, describe)
