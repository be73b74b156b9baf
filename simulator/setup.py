"""What a simulation is given and what it returns: the fleet's events, the settings
(``SimConfig``), the routers' model of the engines, and the per-request result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from benchkit.report import ModeStats
from emulator.options import EmulatorOptions
from emulator.pool_profiles import KvLoad, PoolProfile
from kvgate.config.sections.disaggregation import DEFAULT_SKIP_PREFILL_BELOW, SkipRule
from kvgate.config.sections.placement import GateConfig
from kvgate.placement.cost import POOL_LOAD_ASYNC, POOL_LOAD_IN_STEP, EngineCost
from simulator.routing import RouterSetup


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """``fail`` or ``drain`` engine ``engine`` (an index) at emulated time ``time``."""

    kind: str
    engine: int
    time: float


LOAD_REFRESH_S = 0.05
PROMPT_ERROR = 0.25
# SimConfig.pool_read_order's values (`--pool-read-order`): READ_AS_CONNECTOR is
# READ_WHEN_REACHED or READ_IN_STEP, as the pool profile's connector loads (`read_order_of`).
READ_ON_ARRIVAL, READ_WHEN_REACHED, READ_IN_STEP = "arrival", "vllm", "step"
READ_AS_CONNECTOR = "connector"
POOL_READ_ORDERS = (READ_ON_ARRIVAL, READ_WHEN_REACHED, READ_IN_STEP, READ_AS_CONNECTOR)


def read_order_of(order: str, profile: PoolProfile) -> str:
    """The order a run uses: `connector` is the profile's connector's own (PoolProfile.kv_load:
    an asynchronous load is vLLM's waiting order, one in the step holds the step)."""
    if order != READ_AS_CONNECTOR:
        return order
    return READ_WHEN_REACHED if profile.kv_load is KvLoad.ASYNC else READ_IN_STEP


def check_read_order(order: str, pd: bool) -> None:
    """`--pool-read-order`'s value, for a P/D run or not: a ValueError saying what is wrong."""
    if order not in POOL_READ_ORDERS:
        raise ValueError(f"pool read order must be one of {', '.join(POOL_READ_ORDERS)}, "
                         f"got {order!r}")
    if pd and order != READ_ON_ARRIVAL:
        raise ValueError(f"--pool-read-order {order} is not modelled with --pd")


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
    # The gate knows what the pool holds of a session it might move (exactly, from the
    # simulated pool: what a pool's event stream would tell it), instead of assuming all of it
    # and doubting that with the miss-safe check.
    pool_residency: bool = False
    # The gate knows what each engine's HBM holds of a session (exactly, from the simulated
    # engines' caches: what their KV events tell it) and prices staying with that.
    hbm_residency: bool = False
    # A prefill/decode fleet (`--pd P:D`): engines 0..P-1 prefill, the next D decode; its P/D
    # modes use the split, the colocated ones all engines as they are. None: colocated only.
    pd: tuple[int, int] | None = None
    skip_prefill_below: int = DEFAULT_SKIP_PREFILL_BELOW  # pd-kvgate's decider
    skip_rule: SkipRule = SkipRule.THRESHOLD  # and what else keeps a turn on the decode engine
    # The decode engines put each prompt they hold to the pool too (AscendStore's
    # `consumer_is_to_put: true`; simulator.pd_simulation). Off: only the prefill side writes it.
    decode_puts: bool = False
    # When a request reading KV from the pool reads, and where it then waits
    # (simulator.read_order): READ_ON_ARRIVAL, from its arrival, then queued behind everything
    # booked before the read ends (every committed figure); READ_WHEN_REACHED, once the engine's
    # scheduler reaches it, passed by the requests behind it while it reads, then first in the
    # queue, as vLLM's scheduler does for an asynchronous load; READ_IN_STEP, once reached,
    # holding the engine's prefill until it ends (a load inside the step); READ_AS_CONNECTOR,
    # whichever of the two the pool profile's connector does.
    pool_read_order: str = READ_ON_ARRIVAL


def router_setup(options: EmulatorOptions, config: SimConfig) -> RouterSetup:
    """The routers' model of the engines: the same speed and links as the simulated ones."""
    cost = EngineCost(prefill_tokens_per_s=options.prefill_tokens_per_s,
                      prefill_overhead_s=options.prefill_overhead_ms / 1000.0,
                      kv_bytes_per_token=options.kv_bytes_per_token, ddr_gbps=options.ddr_gbps,
                      transfer_fixed_s=options.transfer_fixed_ms / 1000.0,
                      prompt_s_per_token=options.prompt_us_per_token / 1e6,
                      node_gbps=options.node_gbps, hbm_tokens=max(1, options.hbm_tokens),
                      pool_load=(POOL_LOAD_IN_STEP if read_order_of(
                          config.pool_read_order, options.pool_profile) == READ_IN_STEP
                          else POOL_LOAD_ASYNC))
    return RouterSetup(cost, config.gate, config.load_max_age_s, options.block_size,
                       max(1, options.hbm_tokens // options.block_size),
                       options.devices_per_node)


@dataclass(slots=True)
class SimResult:
    stats: ModeStats
    per_engine_requests: list[int] = field(default_factory=list)
    assignments: list[int] = field(default_factory=list)  # engine per request, -1 = unrouted
    arrivals: list[float] = field(default_factory=list)  # when each request was sent
    finishes: list[float] = field(default_factory=list)  # its last token (its arrival if unrouted)
    ddr_tokens: list[int] = field(default_factory=list)  # read from the DDR pool, per request


def engine_address(index: int) -> str:
    """The default address of engine ``index``: 10.x.y.z:8000, unique up to 2**24 engines."""
    return f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:8000"
