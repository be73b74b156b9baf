"""The load gate's prefix step (`placement.load_gate.prefix_placement`): a new session, and a
session the gate moves, is priced on each candidate with what that engine already holds of its
prompt's leading blocks (kvgate.placement.prefix), and the engines that hold them are scored
beside the ring's candidates if the load bound admits them. A bound session's turns never ask
(the sticky path is unchanged); what the gateway routed is recorded when a session is placed or
moved, never on its sticky turns.

Where the request's blocks are not known (`Known.blocks` empty: a body ext_proc could not read,
or a prompt shorter than one block) the step answers 0 held everywhere, and the gate decides as
without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvgate.placement.prefix import PrefixHolders, RoutedPrefixes
from kvgate.placement.view import PoolView
from kvgate.routing.policy import Known


class PrefixStep:
    """Where a prompt's leading blocks are held (`holders`: exact, or what was routed), and the
    booking hook that records placements in a `RoutedPrefixes`."""

    __slots__ = ("_index", "holders")

    def __init__(self, holders: PrefixHolders) -> None:
        self.holders = holders
        self._index = holders if isinstance(holders, RoutedPrefixes) else None

    def held(self, address: str, blocks: Sequence[int], limit: int) -> int:
        """Tokens of the prompt `address` would hit, at most `limit` (0: not known)."""
        if not blocks or limit <= 0:
            return 0
        tokens = self.holders.prefix_tokens(address, blocks)
        return 0 if tokens is None else min(tokens, limit)

    def candidates(self, found: Iterator[str], count: int, blocks: Sequence[int],
                   limit: int) -> list[str]:
        """The first `count` of `found` (the ring's candidates under the load bound), then
        every holder of the prompt that holds more of it (up to `limit` tokens) than any of
        those and that `found` yields further on (under the bound too), in ring order. No cap
        on those: the peer's prefix scorer scores every endpoint its filters pass
        (pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go, ``Score``), and its
        index keeps every holder of a block (kvgate.placement.prefix). A prefix every engine
        holds adds none: the ring's candidates stand."""
        picked = [address for _, address in zip(range(count), found, strict=False)]
        if not blocks:
            return picked
        floor = max((self.held(a, blocks, limit) for a in picked), default=0)
        wanted = {a for a in self.holders.holders(blocks)
                  if a not in picked and self.held(a, blocks, limit) > floor}
        for address in found if wanted else ():
            if address in wanted:
                picked.append(address)
                wanted.discard(address)
                if not wanted:
                    break
        return picked

    def pooled(self, view: PoolView, blocks: Sequence[int], limit: int) -> dict[str, int]:
        """Per KV pool, the most of the prompt any of its engines holds: a DDR pool keeps the
        blocks its engines store (vLLM's KV connectors save each computed block:
        ``KVConnectorBase_V1.save_kv_layer``; the emulator's pool, emulator.ddr_pool), so a
        sibling of a holder reads them from DDR rather than prefill them. An estimate: the
        pool may have evicted them (a move's `miss_safe` doubt, not applied here)."""
        found: dict[str, int] = {}
        if not blocks:
            return found
        for address in self.holders.holders(blocks):
            kv_pool = view.kv_pool_of(address)
            if kv_pool is not None:
                found[kv_pool] = max(found.get(kv_pool, 0), self.held(address, blocks, limit))
        return found

    # -- BookingHook ------------------------------------------------------------------------

    def kept(self, pool: str, session: str, endpoint: str, known: Known) -> None:
        pass  # the sticky path records nothing: its blocks were recorded when it was placed

    def routed(self, pool: str, session: str, view: PoolView, endpoint: str,
               previous: str | None, known: Known, *, moved: bool) -> None:
        if self._index is not None and known.blocks and endpoint != previous:
            self._index.record(endpoint, known.blocks)

    def forget(self, address: str) -> None:
        if self._index is not None:
            self._index.forget(address)
