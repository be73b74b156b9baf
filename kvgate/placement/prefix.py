"""Prefixes shared across sessions: where a request's leading blocks are already held, so that a
new session's first placement (and a move) weighs what an engine's prefix cache would hit of
its prompt, not only the session's own context.

A prompt is known by its chained block hashes (vLLM's: block k's hash covers blocks 0..k,
vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``), so what an engine holds of it is a run
of leading blocks. Two sources answer, behind one protocol (`PrefixHolders`):

- exactly, what each engine's prefix cache holds, where the engines' KV events tell it (the
  simulator's own engines: simulator.routing.EngineHoldings);
- else `RoutedPrefixes`, what this router itself sent where: the leading blocks of each
  session it placed, as the peers' routers keep them (the Gateway API Inference Extension's
  prefix-cache scorer, pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go: an LRU of
  block hashes per server, `lruCapacityPerServer` 31,250, matching at most
  `maxPrefixBlocksToMatch` 256 leading blocks; llm-d's "precise" mode reads vLLM's KV events
  instead, guides/precise-prefix-cache-aware). Its memory is bounded as the scorer's
  indexer bounds it (pkg/epp/scheduling/framework/plugins/multi/prefix/indexer.go, ``Add``
  and ``makeEvictionFn``): an LRU of at most `capacity_blocks` blocks per engine, the least
  recently placed forgotten first, and no bound on the engines that hold one block (its
  ``hashToPods`` set): a template placed on all 16 engines is known on all 16. Only a
  prompt's first `leading_blocks` (256, as the scorer's) are kept.

Both need the prompt's block hashes (`Pipeline.decide(blocks=...)`). The simulator hashes every
prompt; ext_proc, like the peers' endpoint pickers, reads the request body, but only for the
decisions that weigh it (ext_proc.prompt_stream), and hashes it in character blocks
(kvgate.routing.prompt_blocks), which the routed index takes; the engines' KV events reach it
keyed by session (kvgate.fleet.residency), not by these hashes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Protocol


class PrefixHolders(Protocol):
    """Where a prompt's leading blocks are held, by its chained block hashes."""

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        """Leading tokens of the prompt whose blocks are `blocks` that `endpoint`'s prefix
        cache would hit now; None: not known."""
        ...

    def holders(self, blocks: Sequence[int]) -> Collection[str]:
        """The endpoints that hold at least the prompt's first block (scored beside the ring's
        candidates, if under the load bound)."""
        ...


class RoutedPrefixes:
    """What this router placed where: per engine, an LRU of the leading blocks it sent there
    (at most `capacity_blocks` each; only a prompt's first `leading_blocks` are kept), and per
    block, every engine that holds it."""

    __slots__ = ("_held", "_lru", "block_tokens", "capacity_blocks", "leading_blocks")

    def __init__(self, capacity_blocks: int, block_tokens: int,
                 leading_blocks: int = 256) -> None:
        if capacity_blocks < 1 or block_tokens < 1 or leading_blocks < 1:
            raise ValueError(f"routed prefixes: capacity_blocks ({capacity_blocks}), "
                             f"block_tokens ({block_tokens}) and leading_blocks "
                             f"({leading_blocks}) must be >= 1")
        self.capacity_blocks = capacity_blocks  # per engine
        self.block_tokens = block_tokens
        self.leading_blocks = leading_blocks
        # A dict as an ordered set: holders are listed in the order they were placed.
        self._held: dict[int, dict[str, None]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def __len__(self) -> int:
        """Blocks known on at least one engine."""
        return len(self._held)

    def record(self, endpoint: str, blocks: Sequence[int]) -> None:
        """A session whose prompt has these blocks was placed on `endpoint`. Recorded last
        block first, so a prompt's first blocks are the most recently used and the last to be
        forgotten (what an engine holds of a prompt stays a prefix)."""
        held = self._held
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
        for block in reversed(blocks[:self.leading_blocks]):
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                held.setdefault(block, {})[endpoint] = None
        while len(lru) > self.capacity_blocks:
            self._drop(endpoint, lru.popitem(last=False)[0])

    def _drop(self, endpoint: str, block: int) -> None:
        engines = self._held.get(block)
        if engines is not None:
            engines.pop(endpoint, None)
            if not engines:
                del self._held[block]

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        """Leading tokens of the prompt this router sent `endpoint` (binary search: a prompt's
        blocks are recorded together, its first ones last)."""
        lru = self._lru.get(endpoint)
        if not blocks or lru is None or blocks[0] not in lru:
            return 0  # the common case for most engines, answered without a search
        lo, hi = 1, min(len(blocks), self.leading_blocks)  # blocks[:lo] held; [hi:] not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid - 1] in lru:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_tokens

    def holders(self, blocks: Sequence[int]) -> Collection[str]:
        return self._held.get(blocks[0], {}).keys() if blocks else ()

    def forget(self, endpoint: str) -> None:
        """`endpoint` failed or left: its cache is gone."""
        for block in self._lru.pop(endpoint, {}):
            self._drop(endpoint, block)
