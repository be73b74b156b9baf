"""vLLM's KV cache events, from the emulator's prefix cache (the facts; the sockets are in
:mod:`emulator.kv_events_zmq`).

What vLLM 0.32/0.33 sends (``vllm/distributed/kv_events.py``, ``vllm/v1/core/block_pool.py``):
a ``KVEventBatch`` per engine step with events, msgspec-encoded as msgpack. The batch is an
array-like struct ``[ts, events, data_parallel_rank]`` (the publisher sets the rank, 0 on one
engine, so it is sent). Each event is a tagged struct, a map whose first key is ``type`` (the class
name), then its fields in declaration order; fields equal to their default are omitted
(``omit_defaults``), fields without a default are always sent, ``None`` included:

- ``BlockStored``: ``block_hashes``, ``parent_block_hash`` (None for a prompt's first block),
  ``token_ids``, ``block_size``, ``lora_id``, ``medium`` ("GPU": vLLM's block pool reports its
  device cache so on every platform), ``lora_name``, then the defaulted ones vLLM sets:
  ``extra_keys`` (one ``None`` per block for plain text), ``group_idx`` (0),
  ``kv_cache_spec_kind`` ("full_attention") and ``session_id`` when the request named one.
  vLLM sends one per prefill of a prompt's new full blocks (``cache_full_blocks``), and one per
  block an answer fills as it is decoded.
- ``BlockRemoved``: ``block_hashes`` (one hash: vLLM sends one event per evicted block, in the
  order the free queue gives them up), ``medium``, ``group_idx``.
- ``AllBlocksCleared``: no field (``reset_prefix_cache``).

Block hashes are the emulator's 64-bit chained hashes (vLLM's are sha256-based, truncated to 64
bits with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, its default); token ids are the emulator's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"
SPEC_KIND = "full_attention"  # vLLM's KVCacheSpecKind for a full-attention model's one group
SESSION_HEADER = "X-Session-ID"  # vLLM's header for a request's session id

Event = dict[str, Any]


def block_stored(hashes: Sequence[int], parent: int | None, token_ids: Sequence[int],
                 block_size: int, session_id: str | None = None) -> Event:
    """A ``BlockStored`` event as vLLM's msgspec encodes it (keys in its order)."""
    event: Event = {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": MEDIUM_GPU,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": SPEC_KIND,
    }
    if session_id is not None:
        event["session_id"] = session_id
    return event


def block_removed(block_hash: int) -> Event:
    """A ``BlockRemoved`` event for one evicted block."""
    return {"type": "BlockRemoved", "block_hashes": [block_hash], "medium": MEDIUM_GPU,
            "group_idx": 0}


def all_blocks_cleared() -> Event:
    """An ``AllBlocksCleared`` event."""
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: Sequence[Event], data_parallel_rank: int = 0) -> bytes:
    """A ``KVEventBatch`` payload: msgpack ``[ts, [events...], data_parallel_rank]``."""
    payload: bytes = msgpack.packb([float(ts), list(events), data_parallel_rank], use_bin_type=True)
    return payload


def session_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The request's session id as vLLM reads it: the body's ``session_id``, else the
    ``X-Session-ID`` header, else ``vllm_xargs.session_id``."""
    given = body.get("session_id")
    if isinstance(given, str) and given:
        return given
    header = headers.get(SESSION_HEADER)
    if header:
        return header
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, Mapping):
        value = xargs.get("session_id")
        if isinstance(value, str) and value:
            return value
    return None


class KvEventLog:
    """A :class:`~emulator.prefix_cache.CacheObserver` turning the cache's stores and evictions
    into vLLM's events, kept until :meth:`take`.

    The cache knows hashes only: before each admission the server calls :meth:`expect` with the
    request's tokens, so a store can carry its blocks' token ids. A store splits as vLLM's do:
    the prompt's new blocks in one event, then one event per answer block.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[Event] = []
        self.on_event: Callable[[], None] | None = None  # called whenever events are added
        self._tokens: Sequence[int] = ()
        self._prompt_blocks = 0
        self._session: str | None = None

    def expect(self, prompt: Sequence[int], output: Sequence[int], prompt_blocks: int,
               session: str | None = None) -> None:
        """The next store is this request's: ``prompt``, then ``output`` without its last token
        (whose KV is never computed), ``prompt_blocks`` of it the prompt's full blocks."""
        self._tokens = [*prompt, *output[: max(0, len(output) - 1)]]
        self._prompt_blocks = prompt_blocks
        self._session = session

    def stored(self, hashes: Sequence[int], start: int) -> None:
        """``hashes[start:]`` were cached (see :class:`~emulator.prefix_cache.CacheObserver`)."""
        bs = self.block_size
        tokens = self._tokens
        first_answer = max(start, self._prompt_blocks)
        if start < first_answer:
            parent = hashes[start - 1] if start else None
            self.pending.append(block_stored(hashes[start:first_answer], parent,
                                             tokens[start * bs : first_answer * bs], bs,
                                             self._session))
        for i in range(first_answer, len(hashes)):
            parent = hashes[i - 1] if i else None
            self.pending.append(block_stored(hashes[i : i + 1], parent,
                                             tokens[i * bs : (i + 1) * bs], bs, self._session))
        self._tokens = ()
        self._prompt_blocks = 0
        self._session = None
        self._added()

    def removed(self, hashes: Sequence[int]) -> None:
        """``hashes`` were evicted, first evicted first: one event each, as vLLM sends them."""
        self.pending.extend(block_removed(h) for h in hashes)
        self._added()

    def cleared(self) -> None:
        """The cache was reset."""
        self.pending.append(all_blocks_cleared())
        self._added()

    def _added(self) -> None:
        if self.on_event is not None and self.pending:
            self.on_event()

    def take(self) -> list[Event]:
        """The events since the last call, oldest first."""
        events, self.pending = self.pending, []
        return events
