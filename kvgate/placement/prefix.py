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
  instead, guides/precise-prefix-cache-aware). Its memory is bounded: at most
  `capacity_blocks` blocks, each held by at most `HOLDERS_PER_BLOCK` engines, the least
  recently placed forgotten first; only a prompt's first `leading_blocks` (256, as the
  scorer's) are kept.

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

# Engines remembered per block: a template placed on more than this many engines is held by all
# of them, and the most recent ones answer (the load bound spreads a popular one).
HOLDERS_PER_BLOCK = 4


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
    """What this router placed where: per leading block, the engines it sent it to, bounded in
    memory (`capacity_blocks`; only a prompt's first `leading_blocks` are kept)."""

    __slots__ = ("_held", "block_tokens", "capacity_blocks", "leading_blocks")

    def __init__(self, capacity_blocks: int, block_tokens: int,
                 leading_blocks: int = 256) -> None:
        if capacity_blocks < 1 or block_tokens < 1 or leading_blocks < 1:
            raise ValueError(f"routed prefixes: capacity_blocks ({capacity_blocks}), "
                             f"block_tokens ({block_tokens}) and leading_blocks "
                             f"({leading_blocks}) must be >= 1")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.leading_blocks = leading_blocks
        self._held: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def record(self, endpoint: str, blocks: Sequence[int]) -> None:
        """A session whose prompt has these blocks was placed on `endpoint`. Recorded last
        block first, so a prompt's first blocks are the most recently used and the last to be
        forgotten (what an engine holds of a prompt stays a prefix)."""
        held = self._held
        for block in reversed(blocks[:self.leading_blocks]):
            engines = held.pop(block, ())
            if endpoint in engines:
                engines = tuple(e for e in engines if e != endpoint)
            held[block] = (*engines[-(HOLDERS_PER_BLOCK - 1):], endpoint)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        """Leading tokens of the prompt this router sent `endpoint` (binary search: a prompt's
        blocks are recorded together, its first ones last)."""
        held = self._held
        if not blocks or endpoint not in held.get(blocks[0], ()):
            return 0  # the common case for most engines, answered without a search
        lo, hi = 1, min(len(blocks), self.leading_blocks)  # blocks[:lo] held; [hi:] not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if endpoint in held.get(blocks[mid - 1], ()):
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_tokens

    def holders(self, blocks: Sequence[int]) -> Collection[str]:
        return self._held.get(blocks[0], ()) if blocks else ()

    def forget(self, endpoint: str) -> None:
        """`endpoint` failed or left: its cache is gone."""
        held = self._held
        for block in [b for b, engines in held.items() if endpoint in engines]:
            rest = tuple(e for e in held[block] if e != endpoint)
            if rest:
                held[block] = rest
            else:
                del held[block]
