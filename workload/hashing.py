"""Block hashes of a segment chain, without text: the same sharing structure as the emulator's
chained hashes over the real tokens (equal prefixes <=> equal hashes), at any block size.

Block i's hash covers its parent's hash and the pieces ``(key, start, end)`` of the segments its
tokens come from, so two prompts share block i exactly when their first ``(i+1) x block_size``
tokens come from the same segments at the same offsets, which is when their texts are equal.
"""

from __future__ import annotations

import multiprocessing
import struct
from array import array
from collections.abc import Iterable, Sequence
from itertools import takewhile
from multiprocessing.connection import Connection

import xxhash

from workload.model import Request, Segment

_ROOT = 0x6B766761_74652D73


class _State:
    """Hashing progress over one chain: full-block hashes so far, pieces of the partial block."""

    __slots__ = ("filled", "hashes", "length", "pieces")

    def __init__(self) -> None:
        self.length = 0  # segments consumed
        self.hashes: list[int] = []
        self.pieces: list[int] = []  # flat key, start, end of the partial block
        self.filled = 0  # tokens in the partial block


class BlockHasher:
    """Chained block hashes of requests' prompts; incremental along a session's chain."""

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self._states: dict[int, _State] = {}

    def hashes(self, request: Request) -> list[int]:
        """Hashes of the prompt's full blocks (a new list the caller may keep)."""
        return list(self._advance(request))

    def _advance(self, request: Request) -> list[int]:
        """The chain's hash list, extended to cover this prompt; it grows with later turns."""
        state = self._states.get(id(request.chain))
        if state is None or state.length > request.length:
            state = self._states[id(request.chain)] = _State()
        self._extend(state, request.chain[state.length : request.length])
        state.length = request.length
        return state.hashes

    def forget(self, request: Request) -> None:
        """Drop a chain's progress (after its last request)."""
        self._states.pop(id(request.chain), None)

    def _extend(self, state: _State, segments: Iterable[Segment]) -> None:
        bs = self.block_size
        hashes = state.hashes
        pieces = state.pieces
        filled = state.filled
        whole = struct.Struct("<Q3q").pack  # one block cut from one segment, the common case
        digest = xxhash.xxh3_64_intdigest
        for key, tokens in segments:
            offset = 0
            while offset < tokens:
                if filled == 0 and tokens - offset >= bs:
                    parent = hashes[-1] if hashes else _ROOT
                    end = tokens - (tokens - offset) % bs
                    for start in range(offset, end, bs):
                        parent = digest(whole(parent, key, start, start + bs))
                        hashes.append(parent)
                    offset = end
                    continue
                take = min(bs - filled, tokens - offset)
                pieces += (key, offset, offset + take)
                offset += take
                filled += take
                if filled == bs:
                    parent = hashes[-1] if hashes else _ROOT
                    raw = struct.pack(f"<Q{len(pieces)}q", parent, *pieces)
                    hashes.append(digest(raw))
                    pieces.clear()
                    filled = 0
        state.filled = filled


class _ChainLists:
    """One part of a workload's sessions, hashed: the hash lists, which list each request uses
    (-1: a session of another part; turns of a session share one list, as they share a chain),
    each prompt's tokens, and whether a later turn resends the request's answer."""

    def __init__(self, requests: int) -> None:
        self.lists: list[list[int]] = []
        self.which = array("q", [-1]) * requests
        self.tokens = array("q", [0]) * requests
        self.resent = bytearray(requests)

    def take(self, other: _ChainLists, flat: list[int], lengths: Sequence[int]) -> None:
        """Add another part's requests (its lists sent as ``flat`` with their ``lengths``)."""
        offset, start = len(self.lists), 0
        for length in lengths:
            self.lists.append(flat[start : start + length])
            start += length
        for i, k in enumerate(other.which):
            if k >= 0:
                self.which[i] = offset + k
                self.tokens[i] = other.tokens[i]
                self.resent[i] = other.resent[i]


def _chain_lists(requests: Sequence[Request], block_size: int, part: int,
                 parts: int) -> _ChainLists:
    """Hash the sessions whose chain (in order of first request) is ``part`` modulo ``parts``."""
    hasher = BlockHasher(block_size)
    last: dict[int, int] = {}
    order: dict[int, int] = {}
    for i, r in enumerate(requests):
        last[id(r.chain)] = i
        order.setdefault(id(r.chain), len(order))
    result = _ChainLists(len(requests))
    index: dict[int, int] = {}  # id of a hash list -> its place in result.lists
    summed: dict[int, tuple[int, int]] = {}  # chain -> segments and tokens summed so far
    for i, request in enumerate(requests):
        chain = request.chain
        if order[id(chain)] % parts != part:
            continue
        hashes = hasher._advance(request)
        k = index.get(id(hashes))
        if k is None:  # result.lists keeps it alive, so its id is not reused
            k = index[id(hashes)] = len(result.lists)
            result.lists.append(hashes)
        result.which[i] = k
        length, tokens = summed.get(id(chain), (0, 0))
        if length > request.length:  # a shorter prompt of the same chain (traces)
            length, tokens = 0, 0
        tokens += sum(segment.tokens for segment in chain[length : request.length])
        result.tokens[i] = tokens
        if last[id(chain)] == i:
            hasher.forget(request)
            summed.pop(id(chain), None)
            continue
        summed[id(chain)] = (request.length, tokens)
        # The segment after the prompt is the answer when a later turn resends it; then the
        # chain's hashes past the prompt are the answer's blocks.
        answer = chain[request.length] if len(chain) > request.length else None
        if answer is not None and answer.tokens == request.max_tokens:
            result.resent[i] = 1
    return result


def _hashed_in_parallel(requests: Sequence[Request], block_size: int,
                        workers: int) -> _ChainLists:
    """The sessions shared out among ``workers`` processes: forked helpers send theirs back
    as flat arrays of 64-bit hashes, rebuilt into lists here."""
    ctx = multiprocessing.get_context("fork")
    helpers = []
    for part in range(1, workers):
        receiver, sender = ctx.Pipe(duplex=False)
        helper = ctx.Process(target=_send_part, args=(sender, requests, block_size, part,
                                                       workers), daemon=True)
        helper.start()
        sender.close()
        helpers.append((helper, receiver))
    mine = _chain_lists(requests, block_size, 0, workers)
    for helper, receiver in helpers:
        try:
            message = receiver.recv()
        except EOFError:
            message = "the process ended without an answer"
        finally:
            receiver.close()
            helper.join()
        if isinstance(message, str):
            raise RuntimeError(f"hashing prompts failed in a helper process: {message}")
        theirs, flat, lengths = message
        mine.take(theirs, flat.tolist(), lengths)
    return mine


def _send_part(sender: Connection, requests: Sequence[Request], block_size: int, part: int,
               parts: int) -> None:
    try:
        result = _chain_lists(requests, block_size, part, parts)
        flat = array("Q")
        for hashes in result.lists:
            flat.extend(hashes)
        lengths = array("q", map(len, result.lists))
        result.lists = []  # sent flat instead
        sender.send((result, flat, lengths))
    except Exception as exc:  # told to the parent, which raises
        sender.send(repr(exc))
    finally:
        sender.close()


class PromptBlocks:
    """Every request's prompt as block hashes, computed once for a whole workload so the modes
    and the oracle share them (forked workers inherit them). Requests of one session refer to
    one list: request i's blocks are ``chain(i)[:len(hashes(i))]``."""

    def __init__(self, requests: Sequence[Request], block_size: int, workers: int = 1) -> None:
        """``workers`` > 1 hashes sessions in that many processes (forked; worth it for a large
        workload only)."""
        self.block_size = block_size
        hashed = (_hashed_in_parallel(requests, block_size, workers) if workers > 1
                  else _chain_lists(requests, block_size, 0, 1))
        self._chains = [hashed.lists[k] for k in hashed.which]
        self.tokens = hashed.tokens.tolist()
        self._outputs = [r.max_tokens for r in requests]
        # A session's last answer is in no prompt: ids of its own serve as well and save hashing
        # it (see answer_hashes).
        self._resent = hashed.resent

    def __len__(self) -> int:
        return len(self.tokens)

    def hashes(self, i: int) -> list[int]:
        """Request i's full-block hashes (a new list)."""
        return self._chains[i][: self.tokens[i] // self.block_size]

    def chain(self, i: int) -> list[int]:
        """The hashes of request i's session so far, shared by its turns (do not modify)."""
        return self._chains[i]

    def answer_blocks(self, i: int) -> int:
        """How many blocks an engine caches of request i's answer (see :meth:`answer_hashes`)."""
        bs = self.block_size
        n = self.tokens[i]
        return (n + max(0, self._outputs[i] - 1)) // bs - n // bs

    def resends_answer(self, i: int) -> bool:
        """Whether a later turn's prompt contains request i's answer."""
        return bool(self._resent[i])

    def answer_hashes(self, i: int) -> list[int]:
        """The blocks an engine caches of request i's answer (prompt + answer without its last
        token, full blocks past the prompt's): the next turn's own blocks where it resends the
        answer, else ids no prompt has (negative, unlike hashes)."""
        start = self.tokens[i] // self.block_size
        end = start + self.answer_blocks(i)
        if self._resent[i]:
            return self._chains[i][start:end]
        return [-((i << 20) | k) - 1 for k in range(end - start)]


def max_hit_blocks(num_tokens: int, block_size: int) -> int:
    """The emulator's n-1 rule, in blocks."""
    return max(0, num_tokens - 1) // block_size


def oracle_hit_rate(requests: Sequence[Request], block_size: int,
                    measured: Sequence[bool], blocks: PromptBlocks | None = None) -> float:
    """Share of measured prompt tokens an infinite cache with perfect routing would serve:
    each prompt's longest run of leading blocks any earlier request computed, prompt or answer
    (n-1 rule)."""
    if blocks is None or blocks.block_size != block_size:
        blocks = PromptBlocks(requests, block_size)
    hits = oracle_hits(requests, block_size, blocks)
    hit = sum(h for h, m in zip(hits, measured, strict=True) if m)
    total = sum(blocks.tokens[i] for i in range(len(requests)) if measured[i])
    return hit / total if total else 0.0


def oracle_hits(requests: Sequence[Request], block_size: int,
                blocks: PromptBlocks | None = None) -> list[int]:
    """Per request, the prompt tokens the oracle's infinite cache serves (see
    :func:`oracle_hit_rate`)."""
    if blocks is None or blocks.block_size != block_size:
        blocks = PromptBlocks(requests, block_size)
    seen: set[int] = set()
    # Per chain, how many of its leading blocks are in ``seen`` already (its earlier turns put
    # them there): only the rest are looked up and added. An answer no prompt resends is in no
    # later prompt, so it is left out.
    added: dict[int, int] = {}
    hits = [0] * len(requests)
    for i in range(len(requests)):
        chain = blocks.chain(i)
        n = blocks.tokens[i]
        prompt = n // block_size
        limit = max_hit_blocks(n, block_size)
        done = added.get(id(chain), 0)
        k = min(done, limit)
        if k < limit:
            k += len(list(takewhile(seen.__contains__, chain[k:limit])))
        end = prompt + blocks.answer_blocks(i) if blocks.resends_answer(i) else prompt
        if end > done:
            seen.update(chain[done:end])
            added[id(chain)] = end
        hits[i] = k * block_size
    return hits
