"""The booking hook that keeps `kvgate.placement.routed_hbm.RoutedHbm` (what each engine's HBM
holds, estimated from what this gateway routed) current: every turn kept or placed is recorded
after the ledger has booked it, so a turn is priced with what its engine held before it."""

from __future__ import annotations

from kvgate.placement.routed_hbm import RoutedHbm
from kvgate.placement.view import PoolView
from kvgate.routing.policy import Known


class RoutedHbmHook:
    """A :class:`~kvgate.routing.policy.BookingHook` over one estimate."""

    __slots__ = ("estimate",)

    def __init__(self, estimate: RoutedHbm) -> None:
        self.estimate = estimate

    def kept(self, pool: str, session: str, endpoint: str, known: Known) -> None:
        # From the tuple, not `known.size`: no object is made on the sticky path.
        seen, prompt = known.seen, known.prompt_tokens
        self.estimate.turn(endpoint, session, prompt if seen is None or prompt > seen.tokens
                           else seen.tokens, known.now)

    def routed(self, pool: str, session: str, view: PoolView, endpoint: str,
               previous: str | None, known: Known, *, moved: bool) -> None:
        seen = known.seen
        context = 0 if seen is None else seen.tokens
        self.estimate.placed(endpoint, session, max(known.prompt_tokens, context),
                             known.blocks, known.now)
