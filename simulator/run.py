"""The event loop: requests in arrival order, first tokens and fleet events on a heap.

Each engine is the emulator's ``EngineModel`` (prefix cache, FCFS slots and prefill queue, the
same TTFT formula), the DDR pool the emulator's ``DdrPool``; the engine's schedule is closed form,
so an arrival is admitted at once (the engine looks it up in HBM as of its prefill start and
unpins its blocks at its finish by itself) and its first token and finish are pushed on the heap.
A DDR write happens at the first token, as in the emulator; a request counts when its last token
is out. A failed engine loses its HBM and every request it has not finished (they count as
errors, and their sessions ask again after the think time, as a user who saw the error would);
a draining engine keeps its sessions but gets no new ones (kvgate) or leaves the load balancer
(Envoy modes).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.modes import Mode
from bench.report import ModeStats
from emulator.ddr_pool import DdrPool
from emulator.engine_model import Admission, EngineModel
from emulator.options import EmulatorOptions
from kvgate.runtime.loop import run as run_loop
from simulator.routing import make_router
from workload.hashing import PromptBlocks
from workload.model import Workload

_FIRST, _FINISH, _FLEET = 0, 1, 2
_NEVER = float("inf")


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """``fail`` or ``drain`` engine ``engine`` (an index) at emulated time ``time``."""

    kind: str
    engine: int
    time: float


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


@dataclass(slots=True)
class SimResult:
    stats: ModeStats
    per_engine_requests: list[int] = field(default_factory=list)
    assignments: list[int] = field(default_factory=list)  # engine per request, -1 = unrouted
    arrivals: list[float] = field(default_factory=list)  # when each request was sent
    finishes: list[float] = field(default_factory=list)  # its last token (its arrival if unrouted)


def engine_address(index: int) -> str:
    return f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:8000"


def simulate(workload: Workload, mode: Mode, config: SimConfig,
             blocks: PromptBlocks | None = None) -> SimResult:
    """Run one mode over the whole workload (``blocks``: its prompts, hashed beforehand)."""
    return run_loop(simulate_async(workload, mode, config, blocks))


async def simulate_async(workload: Workload, mode: Mode, config: SimConfig,
                         blocks: PromptBlocks | None = None) -> SimResult:
    options = config.engine
    if blocks is None or blocks.block_size != options.block_size:
        blocks = PromptBlocks(workload.requests, options.block_size)
    n = options.instances
    engine_config = options.engine_config()
    engines = [EngineModel(engine_config) for _ in range(n)]
    generation = [0] * n
    addresses = list(config.addresses) or [engine_address(i) for i in range(n)]
    if len(addresses) != n:
        raise ValueError(f"{len(addresses)} addresses for {n} engines")
    index = {a: i for i, a in enumerate(addresses)}
    pool = DdrPool(options.pool_tokens, options.block_size) if mode.ddr_pool else None
    clock = [0.0]
    router = make_router(mode, addresses, lambda: clock[0], config.load_factor, config.idle_ttl)
    requests = workload.requests
    measured = [workload.measured(r) for r in requests]
    stats = ModeStats()
    per_engine = [0] * n
    assignments = [-1] * len(requests)
    arrivals = [0.0] * len(requests)
    finishes = [0.0] * len(requests)
    unfinished: list[dict[int, Admission]] = [{} for _ in range(n)]  # per engine, by request
    breakable = any(event.kind == "fail" for event in config.events)
    heap: list[tuple[float, int, int, object]] = []
    seq = 0
    for event in config.events:
        if not 0 <= event.engine < n:
            raise ValueError(f"no engine {event.engine} (engines are 0..{n - 1})")
        heapq.heappush(heap, (event.time, seq, _FLEET, event))
        seq += 1

    def handle(kind: int, data: object) -> None:
        if kind == _FLEET:
            assert isinstance(data, FleetEvent)
            e = data.engine
            if data.kind == "fail":
                generation[e] += 1
                engines[e] = EngineModel(engine_config)  # HBM lost; back empty only if undrained
                router.set_state(addresses[e], "failed")
                for i, admission in unfinished[e].items():  # their streams break now
                    if measured[i]:
                        stats.error(admission.slot.arrival)
                    follow(i, data.time)
                unfinished[e].clear()
            else:
                router.set_state(addresses[e], "draining")
            return
        e, gen, admission, i = data  # type: ignore[misc]
        if gen != generation[e]:
            return  # its engine failed; counted then
        if kind == _FIRST:
            if pool is not None:
                pool.insert(admission.to_pool)
            return
        del unfinished[e][i]
        served(i, admission)

    def served(i: int, admission: Admission) -> None:
        slot = admission.slot
        if measured[i]:
            stats.add(slot.arrival, slot.ttft, slot.finish, admission.prompt_tokens,
                      admission.cached_tokens, admission.hbm_hit_tokens, admission.ddr_hit_tokens)
        follow(i, slot.finish)

    # Requests with a fixed arrival in order, merged with later turns, each due once the
    # previous turn's answer is out plus the user's think time.
    following = workload.next_turns()
    fixed = [i for i, r in enumerate(requests) if r.think_s is None]
    turns: list[tuple[float, int]] = []

    def follow(i: int, answered: float) -> None:
        finishes[i] = answered
        after = following[i]
        if after >= 0:
            heapq.heappush(turns, (answered + (requests[after].think_s or 0.0), after))

    bar = _progress(config.progress, len(requests), mode)
    k = done = 0
    last_fixed = len(fixed)
    while True:
        due = requests[fixed[k]].arrival if k < last_fixed else _NEVER
        turn_first = bool(turns) and turns[0][0] < due  # a fixed arrival wins a tie
        if turn_first:
            due = turns[0][0]
        # Events up to the next arrival first: a finish may make a turn due before it.
        if heap and heap[0][0] <= due:
            _, _, kind, data = heapq.heappop(heap)
            handle(kind, data)
            continue
        if due == _NEVER:
            break
        if turn_first:
            now, i = heapq.heappop(turns)
        else:
            i = fixed[k]
            now = due
            k += 1
        request = requests[i]
        arrivals[i] = now
        done += 1
        clock[0] = now
        address = await router.route(request.session)
        if address is None:
            if measured[i]:
                stats.error(now)
            follow(i, now)
            continue
        e = index[address]
        per_engine[e] += 1
        assignments[i] = e
        engine = engines[e]
        probe = engine.probe_hashes(now, blocks.hashes(i), blocks.tokens[i])
        ddr = pool.lookup(probe.ddr_candidates) if pool is not None else None
        admission: Admission = engine.admit(now, probe, request.max_tokens, ddr)
        event = (e, generation[e], admission, i)
        if pool is not None:  # the first token only matters for the pool write
            heapq.heappush(heap, (admission.slot.first_token, seq, _FIRST, event))
        if breakable:
            unfinished[e][i] = admission
            heapq.heappush(heap, (admission.slot.finish, seq + 1, _FINISH, event))
        else:  # nothing can fail: the schedule is final now
            served(i, admission)
        seq += 2
        if bar is not None and done % 2000 == 0:
            bar.update(done - bar.n)
    if bar is not None:
        bar.update(len(requests) - bar.n)
        bar.close()
    return SimResult(stats, per_engine, assignments, arrivals, finishes)


def _progress(enabled: bool, total: int, mode: Mode):  # type: ignore[no-untyped-def]
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"simulate {mode}", unit="req", mininterval=0.5, leave=False)
