"""Block hashes of a segment chain, without text: the same sharing structure as the emulator's
chained hashes over the real tokens (equal prefixes <=> equal hashes), at any block size.

Block i's hash covers its parent's hash and the pieces ``(key, start, end)`` of the segments its
tokens come from, so two prompts share block i exactly when their first ``(i+1) x block_size``
tokens come from the same segments at the same offsets, which is when their texts are equal.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import takewhile

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


class PromptBlocks:
    """Every request's prompt as block hashes, computed once for a whole workload so the modes
    and the oracle share them (forked workers inherit them). Requests of one session refer to
    one list: request i's blocks are ``chain(i)[:len(hashes(i))]``."""

    def __init__(self, requests: Sequence[Request], block_size: int) -> None:
        hasher = BlockHasher(block_size)
        last = {id(r.chain): i for i, r in enumerate(requests)}
        self.block_size = block_size
        self.tokens: list[int] = []
        self._outputs = [r.max_tokens for r in requests]
        # Whether a later turn resends this request's answer (the segment after its prompt), so
        # the chain's hashes past the prompt are the answer's blocks. A session's last answer is
        # in no prompt: ids of its own serve as well and save hashing it.
        self._resent = bytearray(len(requests))
        self._chains: list[list[int]] = []
        summed: dict[int, tuple[int, int]] = {}  # chain -> segments and tokens summed so far
        for i, request in enumerate(requests):
            chain = request.chain
            self._chains.append(hasher._advance(request))
            length, tokens = summed.get(id(chain), (0, 0))
            if length > request.length:  # a shorter prompt of the same chain (traces)
                length, tokens = 0, 0
            tokens += sum(segment.tokens for segment in chain[length : request.length])
            self.tokens.append(tokens)
            if last[id(chain)] == i:
                hasher.forget(request)
                summed.pop(id(chain), None)
            else:
                summed[id(chain)] = (request.length, tokens)
                answer = chain[request.length] if len(chain) > request.length else None
                if answer is not None and answer.tokens == request.max_tokens:
                    self._resent[i] = 1

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
    seen: set[int] = set()
    # Per chain, how many of its leading blocks are in ``seen`` already (its earlier turns put
    # them there): only the rest are looked up and added. An answer no prompt resends is in no
    # later prompt, so it is left out.
    added: dict[int, int] = {}
    hit = total = 0
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
        if measured[i]:
            hit += k * block_size
            total += n
    return hit / total if total else 0.0
