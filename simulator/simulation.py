"""One simulation as an object: its state, the main loop, and one handler per event kind.

The loop takes, in this order, a transfer that ends first (its loaded request becomes an event),
then the heap's events up to the next send (a finish may make a turn due before it), then the next
arrival. Heap entries are ``(time, tie-break, kind, data)``; the tie-breaks are handed out in the
order events are pushed, so that equal times resolve the same way run after run.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from benchkit.itl import ItlSamples
from benchkit.report import ModeStats, percentile
from emulator.ddr_pool import DdrPool
from emulator.engine_model import Admission, EngineConfig, EngineModel, Probe
from emulator.pool_faults import PoolFaults
from emulator.prefix_cache import PrefixCache
from emulator.transfer import TransferModel
from kvgate.contract.modes import PdMode, RoutingMode
from kvgate.contract.states import EndpointState
from simulator.estimate import PromptEstimate
from simulator.itl import EngineItl
from simulator.observe import EngineGauges, Scraper
from simulator.routing import Ask, EngineHoldings, PoolHoldings, Router, make_router
from simulator.sending import NEVER, SendOrder
from simulator.setup import FleetEvent, SimConfig, SimResult, engine_address, router_setup
from workload.hashing import PromptBlocks
from workload.model import Workload

if TYPE_CHECKING:  # only with the bench extra, imported when a progress bar is wanted
    from tqdm import tqdm

_FIRST, _FINISH, _FLEET, _LOADED, _POOL, _POOL_END = 0, 1, 2, 3, 4, 5
# An admitted request on the heap: its engine, the engine's generation then, the admission, the
# request's index.
_Admitted: TypeAlias = "tuple[int, int, Admission, int]"
# What a heap entry carries: a fleet event, an admitted request, a transfer's id once its blocks
# are loaded, or None for a pool fault's change.
_Entry: TypeAlias = "FleetEvent | _Admitted | int | None"
# A transfer under way: engine, generation, probe, request, DDR blocks, arrival, what was asked.
_Loading: TypeAlias = "tuple[int, int, Probe, int, int, float, Ask]"
_INF = float("inf")


class Simulation:
    """One mode over one workload: build it, then ``await run()`` once."""

    def __init__(self, workload: Workload, mode: RoutingMode | PdMode, config: SimConfig,
                 blocks: PromptBlocks | None = None) -> None:
        options = config.engine
        if blocks is None or blocks.block_size != options.block_size:
            blocks = PromptBlocks(workload.requests, options.block_size)
        self.blocks = blocks
        n = self.n = options.instances
        self.addresses = list(config.addresses) or [engine_address(i) for i in range(n)]
        if len(self.addresses) != n:
            raise ValueError(f"{len(self.addresses)} addresses for {n} engines")
        for event in config.events:
            if not 0 <= event.engine < n:
                raise ValueError(f"no engine {event.engine} (engines are 0..{n - 1})")
        engine_config = options.engine_config()
        self.fleet = _Fleet(engine_config, n)
        self.itl = [EngineItl(engine_config.timing) for _ in range(n)]
        self.index = {a: i for i, a in enumerate(self.addresses)}
        self.pool = (DdrPool(options.pool_tokens, options.block_size, options.pool_connector,
                             options.pool_high_watermark, options.pool_low_watermark)
                     if mode.ddr_pool else None)
        # Whether the pool hears of a request's end (it saves decode blocks or refreshes then).
        self.pool_end = self.pool is not None and (self.pool.profile.store_decode
                                                   or self.pool.profile.touch_at_end)
        self.transfers = (TransferModel(options.transfer_params()) if self.pool is not None
                          else None)
        self.faults = PoolFaults(options.pool_windows)
        self.block_bytes = options.block_size * options.kv_bytes_per_token
        self.loading: dict[int, _Loading] = {}  # by transfer id
        self.pool_up = True
        self.now = 0.0  # the routers' clock: the last send
        self.gauges = [EngineGauges() for _ in range(n)]
        scraper = Scraper(self.addresses, self.gauges,
                          lambda e, at: self.fleet.engines[e].usage(at), config.load_refresh_s)
        holdings = (PoolHoldings(self.pool, lambda: self.pool_up, options.block_size)
                    if config.pool_residency and self.pool is not None else None)
        hbm = self.hbm = (EngineHoldings(self._cache_of, options.block_size, lambda: self.now,
                                         self.addresses)
                          if config.hbm_residency else None)
        self.router = self._build_router(mode, config, scraper, holdings, hbm)
        self.estimate = PromptEstimate(config.prompt_error)
        self.requests = workload.requests
        self.measured = [workload.measured(r) for r in self.requests]
        self.stats = ModeStats(kv_bytes_per_token=options.kv_bytes_per_token,
                               window=_outage(self.faults) if mode.ddr_pool or self.faults
                               else None)
        self.per_engine = [0] * n
        self.assignments = [-1] * len(self.requests)
        self.ddr_tokens = [0] * len(self.requests)
        self.order = SendOrder(workload)
        # Requests are kept until their finish only when an engine may fail under them.
        self.breakable = any(event.kind == "fail" for event in config.events)
        self.heap: list[tuple[float, int, int, _Entry]] = []
        self.seq = 0
        for event in config.events:
            self._push(event.time, _FLEET, event)
        if self.pool is not None:
            for at in self.faults.changes():
                self._push(at, _POOL, None)
        self.bar = _progress(config.progress, len(self.requests), mode)
        self.done = 0

    def _build_router(self, mode: RoutingMode | PdMode, config: SimConfig, scraper: Scraper,
                      holdings: PoolHoldings | None, hbm: EngineHoldings | None) -> Router:
        assert isinstance(mode, RoutingMode)
        return make_router(mode, self.addresses, lambda: self.now, config.load_factor,
                           config.idle_ttl, router_setup(config.engine, config), scraper,
                           holdings, hbm)

    def _reads_pool(self, e: int) -> bool:
        """Engine ``e`` looks prompts up in the DDR pool (when there is one)."""
        return True

    def _output(self, e: int, i: int) -> tuple[int, list[int]]:
        """What engine ``e`` generates for request ``i``: its tokens and their blocks."""
        return self.requests[i].max_tokens, self.blocks.answer_hashes(i)

    def _cache_of(self, address: str) -> PrefixCache | None:
        engine = self.index.get(address)
        return None if engine is None else self.fleet.engines[engine].cache

    def _push(self, at: float, kind: int, data: _Entry) -> None:
        heapq.heappush(self.heap, (at, self.seq, kind, data))
        self.seq += 1

    async def run(self) -> SimResult:
        """Every request sent and answered (or failed); the figures."""
        heap, order = self.heap, self.order
        while True:
            due = order.next_due()
            if self.transfers is not None and self.loading and self._transfers_end(due):
                continue
            if heap and heap[0][0] <= due:
                at, _, kind, data = heapq.heappop(heap)
                self._dispatch(at, kind, data)
                continue
            if due == NEVER:
                break
            await self._on_arrival()
        return self._finish()

    def _transfers_end(self, due: float) -> bool:
        """Transfers ending first: each loaded request becomes an event at its end (+ the fixed
        cost), where it is admitted. False when none ends before the next event or send."""
        assert self.transfers is not None
        ends = self.transfers.next_done()
        heap = self.heap
        if not (ends < _INF and ends <= due and (not heap or ends <= heap[0][0])):
            return False
        for tid, ready in self.transfers.finish_due(ends):
            self._push(ready, _LOADED, tid)
        return True

    def _dispatch(self, at: float, kind: int, data: _Entry) -> None:
        if isinstance(data, FleetEvent):  # kind _FLEET
            self._on_fleet_event(data)
        elif isinstance(data, int):  # kind _LOADED
            self._on_transfer_loaded(data, at)
        elif data is None:  # kind _POOL
            self._on_pool_fault_change(at)
        elif data[1] != self.fleet.generation[data[0]]:
            pass  # its engine failed; counted then
        elif kind == _FIRST:
            self._on_first_token(data, at)
        elif kind == _POOL_END:
            self._on_pool_end(data, at)
        else:
            self._on_finish(data)

    def _next_ask(self) -> tuple[float, int, Ask, list[int]]:
        """The next request sent, as a router is asked about it: (when, its index, the ask, its
        block hashes)."""
        now, i = self.order.pop()
        request = self.requests[i]
        self.done += 1
        self.now = now
        hashes = self.blocks.hashes(i)
        tokens = self.blocks.tokens[i]
        ask = Ask(request.session, self.estimate.tokens(request.session, tokens), tokens, hashes)
        return now, i, ask, hashes

    async def _on_arrival(self) -> None:
        """The next request is sent: route it, then admit it or start loading its DDR blocks."""
        now, i, ask, hashes = self._next_ask()
        address = await self.router.route(ask, now)
        if address is None:
            self._failed(i, now, now)
            return  # (the progress bar counts it with the next routed one)
        self._send(self.index[address], i, ask, hashes, now)
        self._tick()

    def _tick(self) -> None:
        bar = self.bar
        if bar is not None and self.done % 2000 == 0:
            bar.update(self.done - bar.n)

    def _send(self, e: int, i: int, ask: Ask, hashes: list[int], now: float) -> None:
        """Request ``i`` reaches engine ``e``, which looks its prompt up in HBM and the pool."""
        probe, ddr = self._arrive(e, i, ask, hashes, now)
        if ddr and self.transfers is not None:
            self._read(e, probe, i, ddr, now, ask, now)
        else:
            self._admit(e, i, probe, ddr, ask, now)

    def _arrive(self, e: int, i: int, ask: Ask, hashes: list[int],
                now: float) -> tuple[Probe, int | None]:
        """Request ``i`` reaches engine ``e``: counted, and its prompt looked up in HBM (as at
        its prefill start) and in the pool (None: this engine has no pool)."""
        self.per_engine[e] += 1
        self.assignments[i] = e
        self.gauges[e].arrived(now)
        probe = self.fleet.engines[e].probe_hashes(now, hashes, ask.tokens)
        pool = self.pool
        if pool is None or not self._reads_pool(e):
            return probe, None
        if self.pool_up and probe.hbm_blocks < probe.limit_blocks:
            return probe, pool.lookup(probe.pool_hashes, probe.hbm_blocks, now)
        return probe, 0

    def _read(self, e: int, probe: Probe, i: int, ddr: int, arrival: float, ask: Ask,
              now: float) -> None:
        """Request ``i``'s ``ddr`` blocks start their way from the pool to engine ``e``."""
        assert self.transfers is not None
        tid = self.transfers.start(now, e, ddr * self.block_bytes)
        self.loading[tid] = (e, self.fleet.generation[e], probe, i, ddr, arrival, ask)

    def _admit(self, e: int, i: int, probe: Probe, ddr: int | None, ask: Ask,
               arrival: float) -> None:
        """Request ``i``, sent at ``arrival`` and reading nothing, joins engine ``e``'s queue."""
        tokens, answer = self._output(e, i)
        self._place(e, i, self.fleet.engines[e].admit(arrival, probe, tokens, ddr, answer), ask)

    def _place(self, e: int, i: int, admission: Admission, ask: Ask) -> None:
        """An admitted request's schedule is closed form: push its first token and its end."""
        slot = admission.slot
        self._admitted(e, admission, ask)
        self.router.answered(self.addresses[e], ask, slot.first_token, slot.finish)
        event = (e, self.fleet.generation[e], admission, i)
        heap, seq = self.heap, self.seq
        # Three tie-breaks per request, whichever of its events are pushed.
        if self.pool is not None:  # the first token only matters for the pool write
            heapq.heappush(heap, (slot.first_token, seq, _FIRST, event))
        if self.pool_end:
            heapq.heappush(heap, (slot.finish, seq + 2, _POOL_END, event))
        if self.breakable:
            self.fleet.unfinished[e][i] = admission
            heapq.heappush(heap, (slot.finish, seq + 1, _FINISH, event))
        else:  # nothing can fail: the schedule is final now
            self._served(i, admission)
        self.seq = seq + 3

    def _admitted(self, e: int, admission: Admission, ask: Ask) -> None:
        """Engine ``e``'s gauges and step accounting hear of an admitted request; the gate's
        view of its KV events, of the blocks it cached."""
        slot = admission.slot
        if self.hbm is not None:
            self.hbm.stored(self.addresses[e], ask.session, admission.hashes)
        self.gauges[e].admitted(slot.prefill_start, slot.finish)
        self.itl[e].prefill(slot.prefill_start, slot.first_token,
                            admission.prompt_tokens - admission.cached_tokens)

    def _served(self, i: int, admission: Admission, prefill: Admission | None = None) -> None:
        """Request ``i`` answered (``prefill``: its prompt's figures, when another engine
        prefilled it)."""
        slot = admission.slot
        prompt = admission if prefill is None else prefill
        self.ddr_tokens[i] = prompt.ddr_hit_tokens
        if self.measured[i]:
            self.stats.add(slot.arrival, slot.ttft, slot.finish, prompt.prompt_tokens,
                           prompt.cached_tokens, prompt.hbm_hit_tokens, prompt.ddr_hit_tokens)
            self.itl[self.assignments[i]].stream(slot.first_token, slot.finish)
        self.order.answered(i, slot.finish)

    def _failed(self, i: int, arrival: float, at: float) -> None:
        """Request ``i`` (sent at ``arrival``) got an error at ``at``."""
        if self.measured[i]:
            self.stats.error(arrival)
        self.order.answered(i, at)

    def _on_first_token(self, admitted: _Admitted, at: float) -> None:
        """The prompt's blocks are written to the pool (if it is up)."""
        admission = admitted[2]
        if self.pool is not None and self.pool_up:
            self.pool.store(admission.to_pool, admission.hbm_blocks, admission.ddr_blocks, at)

    def _on_pool_end(self, admitted: _Admitted, at: float) -> None:
        """The answer's blocks (or the profile's refresh) at the request's end."""
        admission = admitted[2]
        if self.pool is not None and self.pool_up:
            self.pool.finish(admission.to_pool, admission.answer, admission.hbm_blocks,
                             admission.ddr_blocks, at)

    def _on_finish(self, admitted: _Admitted) -> None:
        """The last token of a request whose engine might have failed under it."""
        e, _, admission, i = admitted
        del self.fleet.unfinished[e][i]
        self._served(i, admission)

    def _on_fleet_event(self, event: FleetEvent) -> None:
        """An engine drains, or fails with every request it has not finished."""
        e = event.engine
        if event.kind == "drain":
            self.router.set_state(self.addresses[e], EndpointState.DRAINING)
            return
        self.router.set_state(self.addresses[e], EndpointState.FAILED)
        self.gauges[e].lost()
        for i, admission in self.fleet.fail(e):  # their streams break now
            self._failed(i, admission.slot.arrival, event.time)

    def _on_transfer_loaded(self, tid: int, at: float) -> None:
        """A request's DDR blocks are in: it is admitted, its TTFT counted from its arrival."""
        e, gen, probe, i, ddr, arrival, ask = self.loading.pop(tid)
        if gen != self.fleet.generation[e]:  # its engine failed while the blocks were on their way
            self._failed(i, arrival, at)
            return
        tokens, answer = self._output(e, i)
        self._place(e, i, self.fleet.engines[e].admit(at, probe, tokens, ddr, answer,
                                                      arrival=arrival), ask)

    def _on_pool_fault_change(self, at: float) -> None:
        """The pool goes down, slows, or comes back (empty)."""
        assert self.pool is not None and self.transfers is not None
        factor = self.faults.factor(at)
        self.pool_up = factor > 0
        if factor > 0:
            self.transfers.set_factor(at, factor)
        if self.faults.recovered_at(at):
            self.pool.clear()

    def _finish(self) -> SimResult:
        bar = self.bar
        if bar is not None:
            bar.update(len(self.requests) - bar.n)
            bar.close()
        if self.transfers is not None:
            _pool_figures(self.stats, self.transfers, self.n)
        self.stats.itl = ItlSamples()
        for engine in self.itl:
            engine.collect(self.stats.itl)
        return SimResult(self.stats, self.per_engine, self.assignments, self.order.sent,
                         self.order.answered_at, self.ddr_tokens)


def _outage(faults: PoolFaults) -> tuple[float, float] | None:
    """The first window the pool is down, whose requests are also counted apart."""
    down = [w for w in faults.windows if w.down]
    return (down[0].start, down[0].end) if down else None


def _pool_figures(stats: ModeStats, transfers: TransferModel, engines: int) -> None:
    """The pool's read traffic (GB/s per second: mean, peak) and its nodes' links' utilisation
    p99, over the measured span."""
    start, end = stats.first_arrival, stats.last_finish
    if not end > start:
        return
    params = transfers.params
    gbps = transfers.traffic.pool_gbps(start, end)
    stats.pool_read_gbps_mean = sum(gbps) / len(gbps) if gbps else 0.0
    stats.pool_read_gbps_peak = max(gbps, default=0.0)
    nodes = -(-engines // params.devices_per_node)
    stats.node_link_utilisation_p99 = percentile(
        transfers.traffic.node_utilisation(nodes, params.node_capacity_gbps, start, end), 99)


class _Fleet:
    """The engines; a failed one is replaced by an empty one of a new generation, so events
    still queued for the old one are recognised and dropped."""

    def __init__(self, config: EngineConfig, n: int) -> None:
        self._config = config
        self.engines = [EngineModel(config) for _ in range(n)]
        self.generation = [0] * n
        # Per engine, its admitted and unfinished requests by index (kept only when one may fail).
        self.unfinished: list[dict[int, Admission]] = [{} for _ in range(n)]

    def fail(self, e: int) -> list[tuple[int, Admission]]:
        """Engine ``e`` loses its HBM and every request it has not finished (returned)."""
        self.generation[e] += 1
        self.engines[e] = EngineModel(self._config)
        broken = list(self.unfinished[e].items())
        self.unfinished[e].clear()
        return broken


def _progress(enabled: bool, total: int, mode: RoutingMode | PdMode) -> tqdm[NoReturn] | None:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"simulate {mode}", unit="req", mininterval=0.5, leave=False)
