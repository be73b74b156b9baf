"""What a decision knows of one engine at one instant: the signals a scoring term reads
(kvgate.placement.terms).

- `backlog_s`: seconds of prefill queued there (the load board's: this router's ledger, or the
  engine's own report, whichever is larger);
- `gauge(name)`: a gauge the engine reports (kvgate.contract.vllm.GAUGES), as last observed;
- `hbm_share(...)`, `eviction_rate`: what its HBM holds of a session and how fast it evicts,
  where the engines' KV events are read;
- `ddr_read_s(tokens)`: a read from the DDR pool behind the reads this router booked on the
  engine's device and node links (kvgate.placement.links), where it keeps them.

Each is read when a term first asks, and the backlog is kept for the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvgate.placement.links import LinkBacklog
from kvgate.placement.live import LoadBoard, ObservedLoad


class HbmResidency(Protocol):
    """How much of a session's context an engine's HBM still holds, where that can be known
    (the engine's KV cache events: kvgate.fleet.residency; the simulator's own engines; the
    gate's estimate, kvgate.placement.routed_hbm)."""

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        """Of what the session last stored on `endpoint` (its last prompt and answer there),
        the share its prefix cache still holds as a leading run, in [0, 1]; None when not
        known (the gate then assumes it all there)."""
        ...

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        """Leading tokens of the session's context `endpoint` would hit in its prefix cache now,
        in the engine's units (real tokens), at most ``context_tokens``; None when not known."""
        ...

    def eviction_rate(self, endpoint: str) -> float | None:
        """Blocks `endpoint`'s HBM evicted per second over about the last minute
        (kvgate.placement.evictions); None when not known."""
        ...


# (endpoint, session) -> share held: `HbmResidency.hbm_share`'s signature
HbmShare = Callable[[str, str], float | None]
# (endpoint, session, context tokens) -> tokens held: `HbmResidency.hbm_tokens`' signature
HbmTokens = Callable[[str, str, int], int | None]


def held_context(hbm_share: HbmShare, endpoint: str, session: str, context: int) -> int | None:
    """What `endpoint`'s HBM holds of a session's `context` (its last prompt there, in the
    gate's units: tokens estimated from headers); None: not known.

    The residency counts in the engine's units (real tokens, whole blocks), the context in the
    gate's, and the two differ by the estimate's error, which is not steady from turn to turn:
    a per-session factor and a per-request noise (simulator/estimate.py). So the residency is
    asked for a share, unit-free: of what the session last stored there, what is still held
    as a leading run. vLLM stores every full block, the prompt's and the generated ones
    (vllm/v1/core/block_pool.py ``cache_full_blocks``, one ``BlockStored`` per batch of
    them) and frees a request's blocks tail first (single_type_kv_cache_manager.py ``free``),
    so eviction eats a context from its end and a hit stops at the first block gone
    (kv_cache_manager.py ``get_computed_blocks``). All held: all of `context`, nothing to
    scale; else that share of it (docs/journal/agentic-peak.md, "held share")."""
    share = hbm_share(endpoint, session)
    if share is None or share >= 1.0:
        return None if share is None else context
    return round(context * max(0.0, share))


def held_prompt(hbm_tokens: HbmTokens, endpoint: str, session: str, prompt: int, blocks: int,
                block_tokens: int | None) -> int | None:
    """What `endpoint`'s HBM holds of the request's own `prompt` (estimated), in the
    estimate's units; None: not known. The P/D decider's question: the prompt is the one being
    decided, so its real size is known where its whole blocks are (`blocks` of
    `block_tokens`), and what is held (real tokens: vLLM caches only full blocks,
    single_type_kv_cache_manager.py ``cache_blocks``) is put in its units by its own ratio,
    real over estimate. (A session's previous prompt has another ratio: held_context.)"""
    ratio = blocks * block_tokens / prompt if block_tokens and blocks and prompt > 0 else 1.0
    real = int(prompt * ratio)  # (as computed before held_context took shares: same floats)
    whole = real - real % block_tokens if block_tokens else real
    held = hbm_tokens(endpoint, session, whole)
    if held is None or held >= whole:
        return None if held is None else prompt
    return min(prompt, int(held / ratio))


class EngineSignals:
    """One engine's signals at `now`, for one decision."""

    __slots__ = ("_backlog", "_board", "_hbm", "_links", "address", "now")

    def __init__(self, address: str, now: float, board: LoadBoard,
                 hbm: HbmResidency | None = None, backlog_s: float | None = None,
                 links: LinkBacklog | None = None) -> None:
        """`backlog_s`: the board's backlog already read at `now` (else read on first use)."""
        self.address = address
        self.now = now
        self._board = board
        self._hbm = hbm
        self._backlog = backlog_s
        self._links = links

    @property
    def backlog_s(self) -> float:
        """Seconds of prefill queued ahead of a request sent there now."""
        backlog = self._backlog
        if backlog is None:
            backlog = self._backlog = self._board.backlog_s(self.address, self.now)
        return backlog

    @property
    def observed(self) -> ObservedLoad | None:
        """The engine's latest report, if fresh enough to count."""
        return self._board.observed(self.address, self.now)

    def gauge(self, name: str) -> float | None:
        """Gauge `name` (kvgate.contract.vllm.GAUGES) as last reported; None: no fresh report."""
        seen = self.observed
        return None if seen is None else seen.figures.get(name)

    @property
    def eviction_rate(self) -> float | None:
        """Blocks its HBM evicted per second lately; None: not known."""
        return None if self._hbm is None else self._hbm.eviction_rate(self.address)

    def hbm_share(self, session: str) -> float | None:
        """The share of what `session` last stored there its HBM still holds; None: not
        known."""
        hbm = self._hbm
        return None if hbm is None else hbm.hbm_share(self.address, session)

    def ddr_read_s(self, tokens: int) -> float | None:
        """Seconds to read `tokens` from the DDR pool into its HBM, sent now, behind the reads
        booked on its links; None: no links kept."""
        links = self._links
        return None if links is None else links.read_s(self.address, self.now, tokens)
