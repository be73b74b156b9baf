"""Each mode's choice of engine, with the gateway's code: Envoy's ring (``EnvoyRing``), and for
kvgate the core's decision pipeline (``kvgate.routing.Pipeline``, with the gated policy or the
static one) over an in-memory binding store on the simulation's clock. The peers' policies are in
``simulator.peers``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from emulator.ddr_pool import DdrPool
from emulator.prefix_cache import PrefixCache
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.config.sections.placement import GateConfig
from kvgate.contract.modes import RoutingMode
from kvgate.contract.states import EndpointState, MoveReason
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.placement import EnvoyRing, session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.evictions import EvictionRate
from kvgate.placement.live import LoadBoard, ObservedLoad
from kvgate.placement.view import Member, PoolView
from kvgate.routing import STATIC, DecisionError, Pipeline, Policy, build_policy
from kvgate.session import normalize_session
from simulator.observe import Scrape

POOL = "sim"


class Ask(NamedTuple):
    """What a router knows of a request when it picks an engine."""

    session: str
    prompt_tokens: int  # the prompt's size as estimated from its headers (what ext_proc sees)
    tokens: int = 0  # its size as counted from its body (what the peers' routers parse)
    hashes: Sequence[int] = ()  # the prompt's block hashes (the peers hash the prompt)


@dataclass(frozen=True, slots=True)
class RouterSetup:
    """How the load-aware routers see the fleet: the engines' speed (their cost model) and the
    load gate's settings, and how old an engine's scrape may be before it counts for nothing."""

    cost: EngineCost = field(default_factory=EngineCost)
    gate: GateConfig = field(default_factory=GateConfig)
    max_age_s: float = 2.0
    block_size: int = 16
    index_blocks: int = 550_000 // 16  # a peer's prefix index per engine, in blocks
    devices_per_node: int = 8  # engine i on node i // this (emulator/transfer.py)


class Metrics(Protocol):
    """The engines' metrics as last scraped (see ``simulator.observe.Scraper``)."""

    def scrape(self, address: str, now: float) -> Scrape | None: ...


class Router(Protocol):
    async def route(self, ask: Ask, now: float) -> str | None: ...

    def set_state(self, address: str, state: EndpointState) -> None: ...

    def answered(self, address: str, ask: Ask, first_token: float, finish: float) -> None:
        """The request's stream: its first token and its end, as the router will see them
        (instants that may be ahead of the clock; a router uses them only once passed)."""

    def queued(self, address: str, ask: Ask) -> None:
        """The request waits at ``address`` with its schedule not yet known (``--pool-read-order
        vllm``, simulator.read_order); ``answered`` follows once it is."""


class _Blind:
    """A router that does not follow the streams it serves."""

    def answered(self, address: str, ask: Ask, first_token: float, finish: float) -> None:
        pass

    def queued(self, address: str, ask: Ask) -> None:
        pass


class _Members:
    """Endpoint states; the active ones in Envoy's host order."""

    def __init__(self, addresses: Sequence[str], kv_pools: Sequence[str]) -> None:
        self.members = [Member(a, k) for a, k in zip(addresses, kv_pools, strict=True)]

    def set_state(self, address: str, state: EndpointState) -> None:
        self.members = [Member(m.address, m.kv_pool, m.weight, state) if m.address == address
                        else m for m in self.members]

    @property
    def active(self) -> list[str]:
        return [m.address for m in self.members if m.state == EndpointState.ACTIVE]


class RoundRobinRouter(_Blind):
    """Envoy ROUND_ROBIN over healthy hosts: every request to the next host."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._members = _Members(addresses, ["none"] * len(addresses))
        self._active = self._members.active
        self._next = 0

    async def route(self, ask: Ask, now: float) -> str | None:
        if not self._active:
            return None
        address = self._active[self._next % len(self._active)]
        self._next += 1
        return address

    def set_state(self, address: str, state: EndpointState) -> None:
        self._members.set_state(address, state)
        self._active = self._members.active


class RingHashRouter(_Blind):
    """Envoy RING_HASH on the session header, over healthy hosts."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._members = _Members(addresses, ["none"] * len(addresses))
        self._ring = EnvoyRing([(a, 1) for a in self._members.active])

    async def route(self, ask: Ask, now: float) -> str | None:
        return self._ring.pick(session_hash(ask.session.encode()))

    def set_state(self, address: str, state: EndpointState) -> None:
        self._members.set_state(address, state)
        self._ring = EnvoyRing([(a, 1) for a in self._members.active])


class _Directory:
    """What ext_proc's EndpointDirectory offers the pipeline: a PoolView per pool."""

    def __init__(self, members: _Members) -> None:
        self._members = members
        self._view = PoolView(POOL, tuple(members.members))

    def view(self, pool: str) -> PoolView:
        return self._view

    def refresh(self) -> None:
        self._view = PoolView(POOL, tuple(self._members.members))


class PoolHoldings:
    """What the simulated DDR pool holds of the request being routed, exactly (the simulator's
    own pool, a pure query): the gate's ``PoolResidency`` under ``--pool-residency on``, what a
    pool's event stream would tell the live gate. The router sets ``asking`` before it decides."""

    def __init__(self, pool: DdrPool, up: Callable[[], bool], block_size: int) -> None:
        self.pool = pool
        self.up = up
        self.block_size = block_size
        self.asking: Sequence[int] = ()  # the prompt's block hashes

    def pool_tokens(self, kv_pool: str, session: str, context_tokens: int) -> int | None:
        """See ``kvgate.routing.policy.PoolResidency``; a pool that is down holds nothing."""
        if not self.up():
            return 0
        return min(context_tokens, self.pool.held_prefix(self.asking) * self.block_size)


class EngineHoldings:
    """What each simulated engine's HBM holds of the request being routed, exactly (its prefix
    cache, a pure query): the gate's ``HbmResidency`` under ``--hbm-residency on``, what the
    engines' KV events tell the live gate (``kvgate.fleet.residency``). The router sets
    ``asking`` before it decides."""

    def __init__(self, cache_of: Callable[[str], PrefixCache | None], block_size: int,
                 clock: Callable[[], float] = lambda: 0.0, addresses: Sequence[str] = ()
                 ) -> None:
        self.cache_of = cache_of
        self.block_size = block_size
        self.clock = clock  # the routers' (emulated seconds)
        self.addresses = tuple(addresses)  # the engines (`holders`)
        self.asking: Sequence[int] = ()  # the prompt's block hashes
        self._rates: dict[str, EvictionRate] = {}
        # (engine, session) -> the blocks it stored at its last turn there (`stored`)
        self._stored: dict[tuple[str, str], Sequence[int]] = {}

    def stored(self, endpoint: str, session: str, blocks: Sequence[int]) -> None:
        """A turn of `session` admitted on `endpoint`, which cached `blocks`: its prompt's and
        answer's full blocks (emulator.engine_model ``admit``), as its KV events would name
        them (kvgate.fleet.residency: the session's chain, to the depth of its last block),
        under the session's key as the gate has it (its events' ids are normalized alike)."""
        key = normalize_session(session.encode())
        if blocks and key is not None:
            self._stored[endpoint, key] = blocks

    def eviction_rate(self, endpoint: str) -> float | None:
        """See ``kvgate.routing.policy.HbmResidency``: from the engine's own count of evicted
        blocks, sampled whenever the gate asks (the live collector samples every round)."""
        cache = self.cache_of(endpoint)
        if cache is None:
            return None
        rate = self._rates.get(endpoint)
        if rate is None:
            rate = self._rates[endpoint] = EvictionRate()
        rate.sample(self.clock(), cache.evictions)
        return rate.per_s()

    def hbm_share(self, endpoint: str, session: str) -> float | None:
        """See ``kvgate.routing.policy.HbmResidency``: of the blocks the session stored at its
        last turn on `endpoint`, the leading run its prefix cache still holds."""
        cache = self.cache_of(endpoint)
        blocks = self._stored.get((endpoint, session))
        if cache is None or blocks is None:
            return None
        return cache.match(blocks) / len(blocks)

    def hbm_tokens(self, endpoint: str, session: str, context_tokens: int) -> int | None:
        """See ``kvgate.routing.policy.HbmResidency``: the prompt being routed (``asking``)."""
        cache = self.cache_of(endpoint)
        if cache is None:
            return None
        return min(context_tokens, cache.match(self.asking) * self.block_size)

    def prefix_tokens(self, endpoint: str, blocks: Sequence[int]) -> int | None:
        """See ``kvgate.placement.prefix.PrefixHolders``: the engine's prefix cache itself."""
        cache = self.cache_of(endpoint)
        return None if cache is None else cache.match(blocks) * self.block_size

    def holders(self, blocks: Sequence[int]) -> list[str]:
        """See ``kvgate.placement.prefix.PrefixHolders``."""
        first = blocks[:1]
        return [a for a in self.addresses
                if (cache := self.cache_of(a)) is not None and cache.match(first)]


class AffinityRouter:
    """kvgate: sticky bindings, first placement on Envoy's ring with bounded load; with a load
    gate, new sessions go to the least estimated TTFT among their ring candidates and a bound
    session moves to a DDR-pool sibling when that saves enough (``GatedPolicy``)."""

    def __init__(self, addresses: Sequence[str], kv_pools: Sequence[str],
                 clock: Callable[[], float], load_factor: float, idle_ttl: float,
                 policy: Policy = STATIC, holdings: PoolHoldings | None = None,
                 hbm: EngineHoldings | None = None) -> None:
        self._holdings = holdings
        self._hbm = hbm
        self._members = _Members(addresses, kv_pools)
        self._directory = _Directory(self._members)
        store = MemoryBindingStore(idle_ttl=idle_ttl, clock=clock)
        self._policy = policy
        self._pipeline = Pipeline(store, self._directory, load_factor, policy=policy)
        self.moves = 0  # sessions the gate moved (for load, or re-homed off an evicting engine)

    async def route(self, ask: Ask, now: float) -> str | None:
        if self._holdings is not None:
            self._holdings.asking = ask.hashes
        if self._hbm is not None:
            self._hbm.asking = ask.hashes
        try:
            decision = await self._pipeline.decide(POOL, ask.session.encode(), ask.prompt_tokens,
                                                   blocks=ask.hashes)
        except DecisionError:
            return None
        if decision.reason in (MoveReason.LOAD, MoveReason.EVICTED):
            self.moves += 1
        return decision.endpoints[0] if decision.endpoints else None

    def set_state(self, address: str, state: EndpointState) -> None:
        self._members.set_state(address, state)
        self._directory.refresh()
        if state is EndpointState.FAILED:
            self._policy.forget(address)  # its queue is gone

    def answered(self, address: str, ask: Ask, first_token: float, finish: float) -> None:
        pass

    def queued(self, address: str, ask: Ask) -> None:
        pass


class ScrapedBoard(LoadBoard):
    """The load gate's :class:`LoadBoard`, its observations taken from the engines' scrapes
    when the gate looks at an engine (the scrape as of the last refresh tick, aged by the
    board as any observation). vLLM's gauges give no seconds of work: the waiting requests
    are priced as ext_proc's scraper prices them (kvgate.routing.engine_load), at the gate's
    `PrefillMix` of what this router booked; the running ones at nothing (their prefill is
    under way or done)."""

    def __init__(self, metrics: Metrics, mix: PrefillMix, max_age_s: float = 2.0) -> None:
        super().__init__(max_age_s)
        self._metrics = metrics
        self._mix = mix  # the gated policy's: its booking hook adds every booked prefill

    def observed(self, address: str, now: float) -> ObservedLoad | None:
        scrape = self._metrics.scrape(address, now)
        if scrape is not None:
            figures = scrape.figures
            self.observe(address, ObservedLoad(scrape.at, figures.waiting * self._mix.mean_s,
                                               figures))
        return super().observed(address, now)


class _NoMetrics:
    def scrape(self, address: str, now: float) -> Scrape | None:
        return None


def make_router(mode: RoutingMode, addresses: Sequence[str], clock: Callable[[], float],
                load_factor: float, idle_ttl: float, setup: RouterSetup | None = None,
                metrics: Metrics | None = None, holdings: PoolHoldings | None = None,
                hbm: EngineHoldings | None = None) -> Router:
    setup = setup or RouterSetup()
    metrics = metrics or _NoMetrics()
    if mode.round_robin:
        return RoundRobinRouter(addresses)
    if mode is RoutingMode.RING_HASH:
        return RingHashRouter(addresses)
    if mode.simulated_only:
        from simulator.peers import make_peer

        return make_peer(mode, addresses, setup, load_factor, metrics)
    # As `kvgate up` describes an emulated fleet: one shared DDR pool, or one HBM each.
    kv_pools = (["ddr-pool"] * len(addresses) if mode.ddr_pool
                else [f"hbm-{i}" for i in range(len(addresses))])
    mix = PrefillMix()
    board = ScrapedBoard(metrics, mix, setup.max_age_s)
    holdings = holdings if mode.ddr_pool and mode.load_aware else None
    hbm = hbm if mode.load_aware else None
    # The simulated fleet's nodes, as its transfer model groups the engines (TransferParams).
    nodes = {a: str(i // setup.devices_per_node) for i, a in enumerate(addresses)}
    # Prefixes shared across sessions: exactly where the engines' KV events tell it (their
    # prefix caches), else what this gateway placed (kvgate.placement.prefix).
    policy = build_policy(setup.gate.turned(mode.load_aware), setup.cost, board,
                          clock=clock, mix=mix, residency=holdings, hbm=hbm,
                          node_of=lambda address: nodes.get(address, address),
                          prefixes=hbm, block_tokens=setup.block_size)
    return AffinityRouter(addresses, kv_pools, clock, load_factor, idle_ttl, policy, holdings,
                          hbm)
