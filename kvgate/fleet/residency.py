"""What one engine's HBM holds of each session, from the engine's own KV cache events.

vLLM tags each ``BlockStored`` with the request's session id (``X-Session-ID``, or the body's
``session_id``: vllm/v1/core/block_pool.py ``BlockPool._build_block_stored_event``), names its
parent block, and sends one ``BlockRemoved`` per evicted block. A prompt hits the prefix cache
only up to its first block not cached (vllm/v1/core/kv_cache_manager.py
``KVCacheManager.get_computed_blocks``), so what matters of a session is the run of its leading
blocks still resident: blocks are freed tail first (vllm/v1/core/single_type_kv_cache_manager.py
``SingleTypeKVCacheManager.free``), so eviction eats a context from its end, but a run can also
break in the middle (another request's hit refreshed a later block).

Each resident block's place in its prompt (its depth) comes from its parent's: a prompt's first
block has no parent (depth 1). A session's answer is the depth of the last block of its leading
resident run, times the block size; blocks it shares with other sessions (a system prompt stored
by whoever came first) count through the parent of its first own block. The record is of events
seen: after a gap in the stream (:meth:`EngineResidency.lost`), or for a session that stored
nothing here since, nothing is known (None), and the gate falls back to its estimates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# Per engine: sessions remembered, the least recently stored forgotten first. An engine's HBM
# holds a few dozen long contexts; the rest are remembered as gone (0) until pushed out.
MAX_SESSIONS = 1024


@dataclass(slots=True)
class _Chain:
    """One session's own blocks on one engine, in prompt order."""

    parent: int | None  # the block before its first own block (None: it starts the prompt)
    blocks: list[int] = field(default_factory=list)
    anchored: bool = True  # what comes before its first own block is known
    intact: int = 0  # leading own blocks all resident
    block_size: int = 0
    base: int = 0  # its parent's place in the prompt (0: none, or not known)


class EngineResidency:
    """One engine's blocks and sessions, from its events in stream order (:meth:`apply`)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS,
                 session_key: Callable[[str], str | None] = lambda raw: raw) -> None:
        self.max_sessions = max_sessions
        self._session_key = session_key  # the id vLLM was sent → the session as kvgate keys it
        self.changed: set[str] = set()  # sessions whose answer may have changed (take_changed)
        self._depth: dict[int, int] = {}  # resident block → its place in its prompt (1-based)
        self._owner: dict[int, tuple[str, int]] = {}  # block → session, index in its chain
        self._chains: OrderedDict[str, _Chain] = OrderedDict()
        self.evicted = 0  # blocks its events reported removed, ever (kvgate.placement.evictions)

    @property
    def sessions(self) -> int:
        return len(self._chains)

    @property
    def blocks(self) -> int:
        """Blocks resident (as far as the events tell)."""
        return len(self._depth)

    def apply(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Events of one batch, in order (``type`` as vLLM tags them; unknown types ignored)."""
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(event)
            elif kind == "BlockRemoved":
                for block in event.get("block_hashes") or ():
                    self.evicted += 1
                    self._removed(_key(block))
            elif kind == "AllBlocksCleared":
                self.cleared()

    def hbm_tokens(self, session: str) -> int | None:
        """Leading tokens of the session's last prompt (and answer) still in this engine's HBM:
        what a prefix-cache hit would find now. None: nothing known of it here."""
        chain = self._chains.get(session)
        if chain is None or not chain.anchored:
            return None
        if not self._leads_to(chain.parent):
            return 0  # the shared part before its own blocks is gone: no hit at all
        if chain.intact:
            last = chain.blocks[chain.intact - 1]
        elif chain.parent is None:
            return 0
        else:
            last = chain.parent
        depth = self._depth[last]
        return depth * chain.block_size if depth else None  # 0: its place is not known

    def stored_tokens(self, session: str) -> int | None:
        """Tokens of the session's last prompt and answer as stored here: the depth of its last
        own block, resident or not (vLLM stores every full block, the generated ones too:
        vllm/v1/core/block_pool.py ``cache_full_blocks``). With :meth:`hbm_tokens`, the share
        still held (kvgate.placement.signals.held_context). None: nothing known of it here,
        or its place is not."""
        chain = self._chains.get(session)
        if chain is None or not chain.anchored or (chain.parent is not None and not chain.base):
            return None
        return (chain.base + len(chain.blocks)) * chain.block_size or None

    def known(self) -> Iterator[tuple[str, int | None, int | None]]:
        """Every session remembered here, with :meth:`hbm_tokens`' and :meth:`stored_tokens`'
        answers."""
        for session in self._chains:
            yield session, self.hbm_tokens(session), self.stored_tokens(session)

    def take_changed(self) -> set[str]:
        """Sessions whose answer may have changed since the last call (a store or an eviction
        of their own blocks; a shared prefix evicted changes the sessions behind it unseen)."""
        changed, self.changed = self.changed, set()
        return changed

    def cleared(self) -> None:
        """``AllBlocksCleared``: nothing resident, every session known to hold nothing."""
        self._depth.clear()
        self._owner.clear()
        self.changed.update(self._chains)
        for chain in self._chains.values():
            chain.intact = 0
            chain.parent, chain.anchored, chain.base = None, True, 0

    def lost(self) -> None:
        """Events were missed: nothing is known any more until sessions store again."""
        self.changed.update(self._chains)
        self._depth.clear()
        self._owner.clear()
        self._chains.clear()

    # -- events ----------------------------------------------------------------------------

    def _stored(self, event: Mapping[str, Any]) -> None:
        blocks = [_key(b) for b in event.get("block_hashes") or ()]
        if not blocks:
            return
        raw_parent = event.get("parent_block_hash")
        parent = None if raw_parent is None else _key(raw_parent)
        # Depth 0: resident, its place unknown (its parent was stored before the events seen).
        base = 0 if parent is None else self._depth.get(parent, 0)
        for i, block in enumerate(blocks):
            self._depth[block] = base + i + 1 if base or parent is None else 0
        raw = event.get("session_id")
        session = self._session_key(raw) if isinstance(raw, str) and raw else None
        if session is None:
            for block in blocks:
                self._owner.pop(block, None)
            return
        self.changed.add(session)
        self._extend(session, parent, blocks, int(event.get("block_size") or 0))

    def _extend(self, session: str, parent: int | None, blocks: list[int],
                block_size: int) -> None:
        chain = self._chains.get(session)
        start = None
        if chain is not None:
            if parent == chain.parent:
                start = 0
            elif parent is not None:
                owner = self._owner.get(parent)
                if owner is not None and owner[0] == session:
                    start = owner[1] + 1
        if chain is None or start is None:
            # A first store here, or one that does not continue the session's chain (its turn
            # hit only a shared prefix, or its context changed): the chain starts afresh.
            if chain is not None:
                self._forget_chain(session, chain)
            # Anchored: its parent's place is known (it is resident, in use by this request).
            base = 0 if parent is None else self._depth.get(parent, 0)
            chain = _Chain(parent, anchored=parent is None or base > 0, base=base)
            start = 0
            self._chains[session] = chain
        else:
            self._chains.move_to_end(session)
        chain.block_size = block_size or chain.block_size
        known = chain.blocks
        overlap = min(len(blocks), len(known) - start)
        if overlap > 0 and known[start:start + overlap] != blocks[:overlap]:
            for index in range(start, len(known)):  # the conversation went another way here
                if self._owner.get(known[index]) == (session, index):
                    del self._owner[known[index]]
            del known[start:]
        chain.intact = min(chain.intact, start)
        for i, block in enumerate(blocks):
            index = start + i
            if index < len(chain.blocks):
                chain.blocks[index] = block
            else:
                chain.blocks.append(block)
            self._owner[block] = (session, index)
        while chain.intact < len(chain.blocks) and chain.blocks[chain.intact] in self._depth:
            chain.intact += 1
        while len(self._chains) > self.max_sessions:
            oldest, old = next(iter(self._chains.items()))
            self._forget_chain(oldest, old)
            del self._chains[oldest]
            self.changed.add(oldest)

    def _removed(self, block: int) -> None:
        self._depth.pop(block, None)
        owner = self._owner.pop(block, None)
        if owner is None:
            return
        chain = self._chains.get(owner[0])
        if chain is not None and owner[1] < chain.intact:
            chain.intact = owner[1]
            self.changed.add(owner[0])

    # -- helpers ---------------------------------------------------------------------------

    def _leads_to(self, block: int | None) -> bool:
        """The shared part before a chain's first own block is resident up to `block`, as far
        as its own session's chain tells (one level: a system prompt's storer)."""
        if block is None:
            return True
        owner = self._owner.get(block)
        if owner is None:
            return block in self._depth
        chain = self._chains.get(owner[0])
        return chain is None or owner[1] < chain.intact

    def _forget_chain(self, session: str, chain: _Chain) -> None:
        for block in chain.blocks:
            if self._owner.get(block, ("", -1))[0] == session:
                del self._owner[block]


def _key(block: Any) -> int:
    """A block hash as an int: vLLM sends 64-bit ints by default, bytes when configured so."""
    return block if isinstance(block, int) else int.from_bytes(block, "big")
