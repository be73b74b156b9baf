"""The event loop: requests in arrival order, first tokens and fleet events on a heap.

Each engine is the emulator's ``EngineModel`` (prefix cache, FCFS slots and prefill queue, the
same TTFT formula), the DDR pool the emulator's ``DdrPool``; the engine's schedule is closed form,
so an arrival is admitted at once (the engine looks it up in HBM as of its prefill start and
unpins its blocks at its finish by itself) and its first token and finish are pushed on the heap.
The pool is written as its connector profile says (``emulator.pool_profiles``): the prompt's
blocks at the first token, the answer's (and a profile's end-of-request refresh) at the last, as
in the emulator; a request counts when its last token is out. A request with blocks to read from
the DDR pool first waits for their transfer (the emulator's ``TransferModel``: shared device and
node links, max-min fair, a fixed cost), whose end is an event too; it is then admitted, its TTFT
counted from its arrival (vLLM's asynchronous KV connectors load while the engine prefills other
requests). The pool can be down or slow for windows (``PoolFaults``): down, every lookup misses
and nothing is stored, and it comes back empty.
A failed engine loses its HBM and every request it has not finished (they count as errors, and
their sessions ask again after the think time, as a user who saw the error would); a draining
engine keeps its sessions but gets no new ones (kvgate) or leaves the load balancer (Envoy modes).
A router knows the engines only through their scraped metrics (``simulator.observe``), what it
sent and the streams it serves, and a prompt's size as it can estimate it (``simulator.estimate``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from emulator.ddr_pool import DdrPool
from emulator.engine_model import Admission, EngineConfig, EngineModel, Probe
from emulator.options import EmulatorOptions
from emulator.pool_faults import PoolFaults
from emulator.transfer import TransferModel
from experiment.report import ModeStats, percentile
from kvgate.contract.modes import RoutingMode
from kvgate.contract.states import EndpointState
from kvgate.placement.cost import EngineCost
from kvgate.placement.gate import GateConfig
from kvgate.runtime.collector import collector_paused
from kvgate.runtime.loop import run as run_loop
from simulator.estimate import PromptEstimate
from simulator.observe import EngineGauges, Scraper
from simulator.routing import Ask, RouterSetup, make_router
from simulator.sending import NEVER, SendOrder
from workload.hashing import PromptBlocks
from workload.model import Workload

if TYPE_CHECKING:  # only with the bench extra, imported when a progress bar is wanted
    from tqdm import tqdm

_FIRST, _FINISH, _FLEET, _LOADED, _POOL, _POOL_END = 0, 1, 2, 3, 4, 5
# What a heap entry carries: a fleet event, a request's admission (engine, generation, admission,
# request), a transfer's id once its blocks are loaded, or None for a pool fault's change.
_Entry: TypeAlias = "FleetEvent | tuple[int, int, Admission, int] | int | None"


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """``fail`` or ``drain`` engine ``engine`` (an index) at emulated time ``time``."""

    kind: str
    engine: int
    time: float


LOAD_REFRESH_S = 0.05
PROMPT_ERROR = 0.25


@dataclass(slots=True)
class SimConfig:
    engine: EmulatorOptions  # instances = engines; block size, HBM, DDR, speed
    load_factor: float = 1.25
    idle_ttl: float = 3600.0
    events: Sequence[FleetEvent] = ()
    progress: bool = False
    # Engine addresses (placement hashes them); default 10.x.y.z:8000. Give a real fleet's to
    # reproduce its placements exactly.
    addresses: Sequence[str] = ()
    # How often the routers scrape the engines' metrics (the Gateway API Inference Extension's
    # endpoint picker: every 50 ms), and how old a scrape may be before it counts for nothing.
    load_refresh_s: float = LOAD_REFRESH_S
    load_max_age_s: float = 2.0
    # The error of the prompt size a router estimates from content-length (lognormal sigma per
    # session; 0: exact token counts), see simulator.estimate.
    prompt_error: float = PROMPT_ERROR
    gate: GateConfig = field(default_factory=GateConfig)


def router_setup(options: EmulatorOptions, config: SimConfig) -> RouterSetup:
    """The routers' model of the engines: the same speed and links as the simulated ones."""
    cost = EngineCost(prefill_tokens_per_s=options.prefill_tokens_per_s,
                      prefill_overhead_s=options.prefill_overhead_ms / 1000.0,
                      kv_bytes_per_token=options.kv_bytes_per_token, ddr_gbps=options.ddr_gbps,
                      transfer_fixed_s=options.transfer_fixed_ms / 1000.0)
    return RouterSetup(cost, config.gate, config.load_max_age_s, options.block_size,
                       max(1, options.hbm_tokens // options.block_size))


@dataclass(slots=True)
class SimResult:
    stats: ModeStats
    per_engine_requests: list[int] = field(default_factory=list)
    assignments: list[int] = field(default_factory=list)  # engine per request, -1 = unrouted
    arrivals: list[float] = field(default_factory=list)  # when each request was sent
    finishes: list[float] = field(default_factory=list)  # its last token (its arrival if unrouted)


def engine_address(index: int) -> str:
    return f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:8000"


def simulate(workload: Workload, mode: RoutingMode, config: SimConfig,
             blocks: PromptBlocks | None = None) -> SimResult:
    """Run one mode over the whole workload (``blocks``: its prompts, hashed beforehand)."""
    with collector_paused():
        return run_loop(simulate_async(workload, mode, config, blocks))


async def simulate_async(workload: Workload, mode: RoutingMode, config: SimConfig,
                         blocks: PromptBlocks | None = None) -> SimResult:
    options = config.engine
    if blocks is None or blocks.block_size != options.block_size:
        blocks = PromptBlocks(workload.requests, options.block_size)
    n = options.instances
    addresses = list(config.addresses) or [engine_address(i) for i in range(n)]
    if len(addresses) != n:
        raise ValueError(f"{len(addresses)} addresses for {n} engines")
    for event in config.events:
        if not 0 <= event.engine < n:
            raise ValueError(f"no engine {event.engine} (engines are 0..{n - 1})")
    fleet = _Fleet(options.engine_config(), n)
    index = {a: i for i, a in enumerate(addresses)}
    pool = (DdrPool(options.pool_tokens, options.block_size, options.pool_connector,
                    options.pool_high_watermark, options.pool_low_watermark)
            if mode.ddr_pool else None)
    # Whether the pool hears of a request's end (it saves decode blocks or refreshes then).
    pool_end = pool is not None and (pool.profile.store_decode or pool.profile.touch_at_end)
    transfers = TransferModel(options.transfer_params()) if pool is not None else None
    faults = PoolFaults(options.pool_windows)
    block_bytes = options.block_size * options.kv_bytes_per_token
    # transfer id -> (engine, generation, probe, request, DDR blocks, arrival, what was asked)
    loading: dict[int, tuple[int, int, Probe, int, int, float, Ask]] = {}
    pool_up = [True]
    clock = [0.0]
    gauges = [EngineGauges() for _ in range(n)]
    scraper = Scraper(addresses, gauges, lambda e, at: fleet.engines[e].usage(at),
                      config.load_refresh_s)
    router = make_router(mode, addresses, lambda: clock[0], config.load_factor, config.idle_ttl,
                         router_setup(options, config), scraper)
    estimate = PromptEstimate(config.prompt_error)
    requests = workload.requests
    measured = [workload.measured(r) for r in requests]
    stats = ModeStats(kv_bytes_per_token=options.kv_bytes_per_token,
                      window=_outage(faults) if mode.ddr_pool or faults else None)
    per_engine = [0] * n
    assignments = [-1] * len(requests)
    order = SendOrder(workload)
    answered = order.answered
    breakable = any(event.kind == "fail" for event in config.events)
    # (time, tie-break, kind, a fleet event or an admitted request: engine, its generation,
    # the admission, the request's index)
    heap: list[tuple[float, int, int, _Entry]] = []
    seq = 0
    for event in config.events:
        heapq.heappush(heap, (event.time, seq, _FLEET, event))
        seq += 1
    if pool is not None:
        for at in faults.changes():
            heapq.heappush(heap, (at, seq, _POOL, None))
            seq += 1

    def served(i: int, admission: Admission) -> None:
        slot = admission.slot
        if measured[i]:
            stats.add(slot.arrival, slot.ttft, slot.finish, admission.prompt_tokens,
                      admission.cached_tokens, admission.hbm_hit_tokens, admission.ddr_hit_tokens)
        answered(i, slot.finish)

    def fleet_event(event: FleetEvent) -> None:
        e = event.engine
        if event.kind == "drain":
            router.set_state(addresses[e], EndpointState.DRAINING)
            return
        router.set_state(addresses[e], EndpointState.FAILED)
        gauges[e].lost()
        for i, admission in fleet.fail(e):  # their streams break now
            if measured[i]:
                stats.error(admission.slot.arrival)
            answered(i, event.time)

    def pool_changes(at: float) -> None:
        assert pool is not None and transfers is not None
        factor = faults.factor(at)
        pool_up[0] = factor > 0
        if factor > 0:
            transfers.set_factor(at, factor)
        if faults.recovered_at(at):
            pool.clear()

    bar = _progress(config.progress, len(requests), mode)
    done = 0
    engines, generation, unfinished = fleet.engines, fleet.generation, fleet.unfinished

    def place(e: int, i: int, admission: Admission, ask: Ask) -> None:
        nonlocal seq
        slot = admission.slot
        gauges[e].admitted(slot.prefill_start, slot.finish)
        router.answered(addresses[e], ask, slot.first_token, slot.finish)
        event = (e, generation[e], admission, i)
        if pool is not None:  # the first token only matters for the pool write
            heapq.heappush(heap, (admission.slot.first_token, seq, _FIRST, event))
        if pool_end:
            heapq.heappush(heap, (admission.slot.finish, seq + 2, _POOL_END, event))
        if breakable:
            unfinished[e][i] = admission
            heapq.heappush(heap, (admission.slot.finish, seq + 1, _FINISH, event))
        else:  # nothing can fail: the schedule is final now
            served(i, admission)
        seq += 3

    def loaded(tid: int, at: float) -> None:
        e, gen, probe, i, ddr, arrival, ask = loading.pop(tid)
        if gen != generation[e]:  # its engine failed while the blocks were on their way
            if measured[i]:
                stats.error(arrival)
            answered(i, at)
            return
        place(e, i, engines[e].admit(at, probe, requests[i].max_tokens, ddr,
                                     blocks.answer_hashes(i), arrival=arrival), ask)

    inf = float("inf")
    while True:
        due = order.next_due()
        # Transfers ending first: a loaded request is admitted at its end (+ the fixed cost).
        if transfers is not None and loading:
            ends = transfers.next_done()
            if ends < inf and ends <= due and (not heap or ends <= heap[0][0]):
                for tid, ready in transfers.finish_due(ends):
                    heapq.heappush(heap, (ready, seq, _LOADED, tid))
                    seq += 1
                continue
        # Events up to the next send first: a finish may make a turn due before it.
        if heap and heap[0][0] <= due:
            at, _, kind, data = heapq.heappop(heap)
            if isinstance(data, FleetEvent):  # kind _FLEET
                fleet_event(data)
                continue
            if isinstance(data, int):  # kind _LOADED
                loaded(data, at)
                continue
            if data is None:  # kind _POOL
                pool_changes(at)
                continue
            e, gen, admission, i = data
            if gen != generation[e]:
                continue  # its engine failed; counted then
            if kind == _FIRST:
                if pool is not None and pool_up[0]:
                    pool.store(admission.to_pool, admission.hbm_blocks, admission.ddr_blocks,
                               at)
            elif kind == _POOL_END:
                if pool is not None and pool_up[0]:
                    pool.finish(admission.to_pool, admission.answer, admission.hbm_blocks,
                                admission.ddr_blocks, at)
            else:
                del unfinished[e][i]
                served(i, admission)
            continue
        if due == NEVER:
            break
        now, i = order.pop()
        request = requests[i]
        done += 1
        clock[0] = now
        hashes = blocks.hashes(i)
        tokens = blocks.tokens[i]
        ask = Ask(request.session, estimate.tokens(request.session, tokens), tokens, hashes)
        address = await router.route(ask, now)
        if address is None:
            if measured[i]:
                stats.error(now)
            answered(i, now)
            continue
        e = index[address]
        per_engine[e] += 1
        assignments[i] = e
        engine = engines[e]
        gauges[e].arrived(now)
        probe = engine.probe_hashes(now, hashes, tokens)
        if pool is None:
            ddr = None
        elif pool_up[0] and probe.hbm_blocks < probe.limit_blocks:
            ddr = pool.lookup(probe.pool_hashes, probe.hbm_blocks, now)
        else:
            ddr = 0
        if ddr and transfers is not None:
            tid = transfers.start(now, e, ddr * block_bytes)
            loading[tid] = (e, generation[e], probe, i, ddr, now, ask)
        else:
            place(e, i, engine.admit(now, probe, request.max_tokens, ddr,
                                     blocks.answer_hashes(i)), ask)
        if bar is not None and done % 2000 == 0:
            bar.update(done - bar.n)
    if bar is not None:
        bar.update(len(requests) - bar.n)
        bar.close()
    if transfers is not None:
        _pool_figures(stats, transfers, n)
    return SimResult(stats, per_engine, assignments, order.sent, order.answered_at)


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


def _progress(enabled: bool, total: int, mode: RoutingMode) -> tqdm[NoReturn] | None:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"simulate {mode}", unit="req", mininterval=0.5, leave=False)
