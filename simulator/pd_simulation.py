"""One P/D mode over one workload: prefill engines, decode engines and the KV handed between
them (``kvgate simulate --pd P:D``).

Engines ``0..P-1`` prefill, the next ``D`` decode. Per turn the mode's router
(``simulator.pd_routers``) names a decode engine and a prefill engine, or none. A remote turn:

1. The prefill engine takes the client's prompt with ``max_tokens: 1`` (vLLM's two-stage wire):
   it looks the prompt up in its HBM and in the DDR pool, loads what the pool has over the
   pool's links (the simulator's ``TransferModel``), computes the rest, and writes the prompt's
   blocks to the pool at its first token. This is the pool as vLLM-Ascend's ``MultiConnector``
   of ``MooncakeConnectorV1`` + ``AscendStoreConnector`` fills it (vllm-ascend
   ``docs/source/user_guide/feature_guide/kv_pool.md``, section 2.3.1; vLLM
   ``multi_connector.py`` ``get_num_new_matched_tokens``: the first child reporting tokens is the
   only loader): on the prefill side Mooncake reports nothing, so AscendStore loads the prefix
   from the pool and saves the prompt back; on the decode side Mooncake reports the remote
   prompt, and ``consumer_is_to_load`` / ``consumer_is_to_put`` are off, so the decode engine
   neither reads nor writes the pool. An answer therefore never reaches the pool.
   ``--pd-decode-puts on`` (``consumer_is_to_put: true``) makes each decode engine a writer
   too: at its first token it offers the prompt it holds (pulled or computed, from block 0)
   to the pool, which puts the blocks it lacks. Sources: vllm-ascend ``ascend_store/
   pool_scheduler.py`` ``build_connector_meta`` (``force_skip_save`` only while the flag is
   off; ``_process_new_request`` saves ``prompt_token_ids`` up to the tokens computed) and
   ``kv_transfer.py`` ``KVCacheStoreSendingThread._handle_stored_request`` (skips only a range
   AscendStore loaded itself; on D Mooncake loaded, so nothing is skipped). Generated tokens
   follow the profile's ``store_decode`` (``save_decode_cache``, off for ascend-store:
   ``_process_running_cached_request``). The decode side still never reads the pool.
2. At the prefill's end the decode engine pulls only what its own HBM lacks
   (``get_num_new_matched_tokens``: ``len(prompt) - num_computed_tokens``) over a link priced as
   ``emulator.pd.Link`` prices it (``--ddr-gbps`` per device, 20 GB/s, plus
   ``--transfer-fixed-ms``), then is admitted with the prompt in hand: it computes the last
   token vLLM always computes and streams the answer. TTFT counts from the client's send.

A skipped turn goes to the decode engine alone, which prefills what it lacks itself (no pool).
The hit rates reported are the prefill's: what the engine that prefilled the turn did not
compute. Engines never fail or drain here (``--fail``/``--drain`` are refused with P/D modes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from emulator.engine_model import Admission
from emulator.pd import Link
from kvgate.contract.modes import PdMode, RoutingMode
from simulator.observe import Scraper
from simulator.pd_routers import PdPick, make_pd_router
from simulator.routing import Ask, EngineHoldings, PoolHoldings, Router
from simulator.setup import SimConfig, router_setup
from simulator.simulation import _FIRST, _POOL_END, Simulation, _Admitted, _Entry
from workload.hashing import PromptBlocks
from workload.model import Workload

_HANDOFF, _PULLED, _DONE = 6, 7, 8


class PdSimulation(Simulation):
    """A P/D mode: build it, then ``await run()`` once."""

    def __init__(self, workload: Workload, mode: PdMode, config: SimConfig,
                 blocks: PromptBlocks | None = None) -> None:
        if config.pd is None:
            raise ValueError(f"{mode} needs a prefill/decode split (--pd P:D)")
        if config.events:
            raise ValueError(f"{mode}: engines failing or drained are not simulated with --pd")
        self.prefillers = config.pd[0]
        if sum(config.pd) != config.engine.instances:
            raise ValueError(f"--pd {config.pd[0]}:{config.pd[1]} needs "
                             f"{sum(config.pd)} engines, not {config.engine.instances}")
        super().__init__(workload, mode, config, blocks)
        options = config.engine
        self.link = Link(options.ddr_gbps, options.transfer_fixed_ms, options.kv_bytes_per_token)
        self.pulled_tokens = 0
        self.decode_puts = config.decode_puts  # consumer_is_to_put (module docstring)
        self.prefilled_on = [-1] * len(self.requests)  # the engine that prefilled each turn
        self._decode_of: dict[int, int] = {}  # turn -> its decode engine, while in flight
        self._asks: dict[int, Ask] = {}
        self._prefill: dict[int, Admission] = {}  # turn -> its prefill engine's admission
        self.stats.pd_turns = 0

    def _build_router(self, mode: RoutingMode | PdMode, config: SimConfig, scraper: Scraper,
                      holdings: PoolHoldings | None, hbm: EngineHoldings | None) -> Router:
        assert isinstance(mode, PdMode)
        p = self.prefillers
        bs = config.engine.block_size

        def cached(address: str, hashes: Sequence[int]) -> int:
            cache = self._cache_of(address)
            return 0 if cache is None else cache.match(hashes) * bs

        if hbm is not None:  # the gate's residency covers the decode engines only
            hbm.addresses = tuple(self.addresses[p:])
        self.pd = make_pd_router(
            mode, self.addresses[:p], self.addresses[p:], clock=lambda: self.now,
            load_factor=config.load_factor, idle_ttl=config.idle_ttl,
            setup=router_setup(config.engine, config), metrics=scraper,
            skip_below=config.skip_prefill_below, skip_rule=config.skip_rule, cached=cached,
            holdings=holdings, hbm=hbm)
        return self.pd

    def _reads_pool(self, e: int) -> bool:
        return e < self.prefillers

    def _output(self, e: int, i: int) -> tuple[int, list[int]]:
        if e < self.prefillers:
            return 1, []  # max_tokens: 1; its one token is not the client's
        return super()._output(e, i)

    async def _on_arrival(self) -> None:
        now, i, ask, hashes = self._next_ask()
        pick: PdPick | None = await self.pd.pick(ask, now)
        if pick is None:
            self._failed(i, now, now)
            return
        d = self.index[pick.decode]
        if self.measured[i]:
            assert self.stats.pd_turns is not None
            self.stats.pd_turns += 1
            self.stats.pd_skipped += pick.prefill is None
        self._decode_of[i] = d
        self._asks[i] = ask
        first = d if pick.prefill is None else self.index[pick.prefill]
        self.prefilled_on[i] = first
        self._send(first, i, ask, hashes, now)
        self._tick()

    def _place(self, e: int, i: int, admission: Admission, ask: Ask) -> None:
        slot = admission.slot
        self._admitted(e, admission, ask)
        event = (e, self.fleet.generation[e], admission, i)
        if e < self.prefillers:
            if self.pool is not None:  # the prefill side saves the prompt to the pool
                self._push(slot.first_token, _FIRST, event)
            self._push(slot.first_token, _HANDOFF, event)
            return
        if self.pool is not None and self.decode_puts:
            self._push(slot.first_token, _FIRST, event)
            if self.pool_end:  # the answer, when the profile stores decode blocks
                self._push(slot.finish, _POOL_END, event)
        self._push(slot.finish, _DONE, event)
        self._served(i, admission, self._prefill.pop(i, None))

    def _on_first_token(self, admitted: _Admitted, at: float) -> None:
        """A decode engine's put offers its prompt from block 0: what it pulled came over the
        P/D link, not from the pool, so no loaded range is skipped."""
        e, _, admission, _ = admitted
        if e < self.prefillers:
            super()._on_first_token(admitted, at)
        elif self.pool is not None and self.pool_up:
            self.pool.store(admission.to_pool, admission.hbm_blocks, 0, at)

    def _on_pool_end(self, admitted: _Admitted, at: float) -> None:
        e, _, admission, _ = admitted
        if e < self.prefillers:
            super()._on_pool_end(admitted, at)
        elif self.pool is not None and self.pool_up:
            self.pool.finish(admission.to_pool, admission.answer, admission.hbm_blocks, 0, at)

    def _dispatch(self, at: float, kind: int, data: _Entry) -> None:
        if kind == _HANDOFF:
            self._on_handoff(cast("_Admitted", data), at)
        elif kind == _PULLED:
            self._on_pulled(cast("_Admitted", data), at)
        elif kind == _DONE:
            e, _, _, i = cast("_Admitted", data)
            self._decode_of.pop(i, None)
            self.pd.decode_done(self.addresses[e], self._asks.pop(i), at)
        else:
            super()._dispatch(at, kind, data)

    def _on_handoff(self, event: _Admitted, at: float) -> None:
        """The prefill answered: the decode engine pulls what its HBM lacks of the prompt."""
        p, gen, admission, i = event
        self.pd.prefill_done(self.addresses[p], self._asks[i], at)
        self._prefill[i] = admission
        d = self._decode_of[i]
        probe = self.fleet.engines[d].probe_hashes(at, self.blocks.hashes(i), self.blocks.tokens[i])
        lacking = (probe.limit_blocks - probe.hbm_blocks) * self.fleet.engines[d].config.block_size
        self.pulled_tokens += lacking
        self._push(at + self.link.seconds(lacking), _PULLED, (p, gen, admission, i))

    def _on_pulled(self, event: _Admitted, at: float) -> None:
        """The decode engine has the prompt: it computes the last token and streams."""
        p, _, prefill, i = event
        ask = self._asks[i]
        self.pd.pulled(self.addresses[p], ask, at)
        d = self._decode_of[i]
        self.per_engine[d] += 1
        self.assignments[i] = d
        self.gauges[d].arrived(at)
        engine = self.fleet.engines[d]
        probe = engine.probe_hashes(at, self.blocks.hashes(i), self.blocks.tokens[i])
        tokens, answer = self._output(d, i)
        self._place(d, i, engine.admit(at, probe, tokens, probe.limit_blocks - probe.hbm_blocks,
                                       answer, arrival=prefill.slot.arrival), ask)
