"""The gate's accountant: once a request is routed, book the prefill it adds to its engine on
the load board (and in the mean a waiting request is priced at), and remember its session's size
for the next turn."""

from __future__ import annotations

from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement.cost import POOL_LOAD_IN_STEP, EngineCost
from kvgate.placement.links import LinkBacklog
from kvgate.placement.live import LoadBoard
from kvgate.placement.signals import held_context
from kvgate.placement.view import PoolView
from kvgate.routing.policy import HbmResidency, Known
from kvgate.routing.prefixes import PrefixStep
from kvgate.routing.recent import RecentSessions


def placed_work(prompt: int, context: int, held: int, *, read_context: bool
                ) -> tuple[int, int]:
    """A placed request's work on its engine, in tokens: (to prefill, to read from the DDR pool
    first). `context`: its session's last prompt, in that engine's HBM (`read_context` False)
    or read from its DDR pool (True: a move within it); `held`: what that engine's prefix
    cache holds of the prompt's leading blocks (0: not known). What the engine holds is not
    prefilled, nor read (vLLM's scheduler computes only the tokens past
    ``KVCacheManager.get_computed_blocks``), except the prompt's last token, which is always
    computed to sample from (vllm/v1/core/kv_cache_manager.py, ``get_computed_blocks``:
    ``max_cache_hit_length = request.num_tokens - 1``; emulator.prefix_cache.max_hit_blocks)."""
    held = min(held, max(0, prompt - 1))
    read = max(0, context - held) if read_context else 0
    return max(0, prompt - max(context, held)), read


class Ledger:
    """A :class:`~kvgate.routing.policy.BookingHook` over one load board."""

    def __init__(self, cost: EngineCost, board: LoadBoard, recent: RecentSessions,
                 mix: PrefillMix) -> None:
        self._cost = cost
        self._in_step = cost.pool_load == POOL_LOAD_IN_STEP  # a read is engine time
        self._board = board
        self._recent = recent
        self._mix = mix
        self.hbm: HbmResidency | None = None  # what each engine's HBM holds, where known
        self.links: LinkBacklog | None = None  # the reads booked on each link, where kept
        # What an engine holds of a placed prompt's leading blocks, where booked as not
        # prefilled (`book_uncached_prefill`; the ledger records placements in it, so the
        # sticky path has no second hook); None: a placed prompt is booked whole.
        self.prefix: PrefixStep | None = None

    def held(self, endpoint: str, known: Known, context: int) -> int | None:
        """What `endpoint`'s HBM holds of `context` (the session's last prompt there), in the
        gate's units (held_context: the share still held of what it stored there); None: not
        known."""
        hbm = self.hbm
        return None if hbm is None else held_context(hbm.hbm_share, endpoint, known.session,
                                                     context)

    def _book(self, endpoint: str, now: float, prefill_s: float,
              ready_at: float | None = None) -> None:
        self._board.routed(endpoint, now, prefill_s, ready_at)
        self._mix.add(prefill_s)

    def _read(self, endpoint: str, now: float, tokens: int) -> float:
        """A read of `tokens` from the DDR pool into `endpoint`'s HBM sent now: when it is in
        (behind the reads booked on its links, where they are kept)."""
        links = self.links
        if links is None:
            return now + self._cost.transfer_s(tokens)
        return links.book(endpoint, now, tokens)

    def _book_read(self, endpoint: str, now: float, prefill_s: float, tokens: int) -> None:
        """A prefill that first reads `tokens` from the DDR pool: the read sent now, the prefill
        ready once it is in (behind the reads booked on its links, where they are kept); where
        the connector loads in the step, the engine's own time (it starts when the engine
        reaches the request, so the links' backlog booked now is not its wait)."""
        ready_at = self._read(endpoint, now, tokens)
        if self._in_step:
            self._book(endpoint, now, prefill_s + self._cost.transfer_s(tokens))
        else:
            self._book(endpoint, now, prefill_s, ready_at)

    def kept(self, pool: str, session: str, endpoint: str, known: Known) -> None:
        """A session that stays: its context is in its engine's HBM, or, where the engine's
        residency says part of it has left, that part is read back from the DDR pool first."""
        # Read from the tuple, not `known.size`: no object is made on the sticky path.
        prompt, seen = known.prompt_tokens, known.seen
        context = 0 if seen is None else seen.tokens
        if prompt > 0:  # unknown size (no body, chunked): nothing booked, as in routed()
            held = self.held(endpoint, known, context)
            if held is None or held >= context:
                self._book(endpoint, known.now, self._cost.prefill_s(prompt - context, prompt))
            else:
                self._book_read(endpoint, known.now,
                                self._cost.prefill_s(prompt - context, prompt), context - held)
        tokens = max(prompt, context)
        if seen is None or seen.tokens != tokens:  # unchanged: nothing written on this path
            self._recent.remember(pool, session, tokens, None)

    def sessionless(self, endpoint: str, now: float, prompt_tokens: int) -> None:
        """A request with no session sent to `endpoint`: its whole prompt is prefilled there
        (nothing to remember for a next turn)."""
        self._book(endpoint, now, self._cost.prefill_s(prompt_tokens, prompt_tokens))

    def routed(self, pool: str, session: str, view: PoolView, endpoint: str,
               previous: str | None, known: Known, *, moved: bool) -> None:
        """A session placed (new, or moved): where its context comes from sets the work."""
        size, now, step = known.size, known.now, self.prefix
        moved_at = now if moved else None
        if size.prompt_tokens <= 0:
            # A request of unknown size (no body: /v1/models; a chunked body) books nothing:
            # guessing would build a backlog from requests that may prefill nothing. Its
            # engine's own report still counts.
            self._recent.remember(pool, session, size.context_tokens, moved_at)
        else:
            held = 0 if step is None else step.held(endpoint, known.blocks, size.prompt_tokens)
            self._placed(pool, session, view, endpoint, previous, known, held, moved_at)
        if step is not None:  # recorded once booked: a placement never finds itself held
            step.routed(pool, session, view, endpoint, previous, known, moved=moved)

    def _placed(self, pool: str, session: str, view: PoolView, endpoint: str,
                previous: str | None, known: Known, held: int, moved_at: float | None
                ) -> None:
        """`routed` for a prompt of known size, `held` tokens of it on `endpoint` already."""
        size, now, cost = known.size, known.now, self._cost
        prompt, context = size.prompt_tokens, size.context_tokens
        if previous == endpoint:  # its context is in this engine's HBM
            uncached, _ = placed_work(prompt, context, held, read_context=False)
            self._book(endpoint, now, cost.prefill_s(uncached, prompt))
        elif previous is not None and view.kv_pool_of(previous) == view.kv_pool_of(endpoint):
            # Moved within its DDR pool: the context is read from DDR first.
            uncached, read = placed_work(prompt, context, held, read_context=True)
            self._book_read(endpoint, now, cost.prefill_s(uncached, prompt), read)
        else:  # new, or from another pool: nothing of its context is here
            uncached, _ = placed_work(prompt, 0, held, read_context=False)
            self._book(endpoint, now, cost.prefill_s(uncached, prompt))
        self._recent.remember(pool, session, max(prompt, context), moved_at)
