"""`placement:` bounded load, the load gate and the engines' speed it prices with.

`GateConfig` is `placement.load_gate`, the one settings type of the gate: the gate itself
(kvgate.routing.gated), its feeds (ext_proc, the collector) and the simulator's `--gate-*`
flags (`DECISION_KEYS`) read it. The engines' speed is kvgate.placement.cost.EngineCost itself
(its keys described here). Every bound is its key's, here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvgate.config.address import HostPort
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import (
    Address,
    Boolean,
    Choice,
    Duration,
    Integer,
    Key,
    ListOf,
    Number,
    Scaled,
    Section,
    Size,
    describe,
    entries,
    key,
)
from kvgate.placement.cost import POOL_LOADS, EngineCost
from kvgate.placement.terms import DEFAULT_TERMS, TERMS

LOAD_SOURCES = ("scrape", "collector")
ROUTED = "routed"  # `hbm_estimate`: from what this gateway routed
HBM_ESTIMATES = ("none", ROUTED)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GateConfig:
    """`placement.load_gate`: the gate's thresholds and terms (what it decides with), and how
    ext_proc feeds it (live load from the engines' metrics, prompt size from content-length)."""

    enabled: bool = key(
        Boolean(), "the load gate: a bound session moves to a sibling in its DDR pool when that "
        "answers sooner; new sessions, and requests with no session but a `content-length`, go "
        "to the least estimated TTFT among their ring candidates. `false`: static stickiness, "
        "exactly as before (nothing scraped, `content-length` not forwarded)", default=True)
    min_saving_s: float = key(Duration(0.0, 3600.0), "a move must save at least this much "
                              "estimated TTFT (more than a user notices; docs/benchmarks.md) "
                              "...", default=1.5)
    min_saving_ratio: float = key(Number(0.0, 1.0), "... and at least this share of the "
                                  "session's estimate on its own engine",
                                  default=0.3)
    cooldown_s: float = key(Duration(0.0, 86400.0), "a session the gate moved stays put this "
                            "long (no flapping between two busy siblings)",
                            default=30.0)
    candidates: int = key(Integer(1, 1024), "endpoints scored per decision, in ring order (1: "
                          "plain ring placement for new sessions)", default=8)
    miss_safe: bool = key(
        Boolean(), "a move must also be no slower if the DDR pool has lost the session's "
        "context (evicted while it lived in HBM, or the pool is down) and the sibling prefills "
        "it all; `false` prices every move as a DDR read", default=True)
    terms: tuple[str, ...] = key(
        ListOf(Choice(tuple(TERMS))), "the terms a request's estimated TTFT on an endpoint is "
        "the sum of (the longest of those that overlap the queue wait, then the others): "
        "`queue_wait` (the prefill queued there), `ddr_read` (its context read from the DDR "
        "pool), `link_backlog` (that read sharing the engine's device and node links with the "
        "reads this router sent there; not in the default), `prefill` (what neither tier holds); "
        "`ddr_read_after_wait` and `link_backlog_after_wait` are those reads after the queue "
        "wait instead of during it, as vLLM's scheduler starts a read (not in the default)",
        default=DEFAULT_TERMS)
    prefix_placement: bool = key(
        Boolean(), "a new session, and a session the gate moves, is priced on each candidate "
        "with what that engine already holds of its prompt's leading blocks (prefixes shared "
        "across sessions: templates, common documents), and the engines holding them are "
        "scored beside the ring's candidates under the load bound: exactly where the engines' "
        "KV events tell it, else from what the gateway placed (`prefix_index_blocks`). Live, "
        "ext_proc reads a request's body only for those decisions (gRPC transport, bodies up "
        "to `session.body_limit`); a bound session's turns send none",
        default=False)
    prefix_index_blocks: int = key(
        Integer(1, 1 << 24), "`prefix_placement` or `book_uncached_prefill` without KV "
        "events: per engine, the leading blocks the gateway remembers having placed there, "
        "least recently placed forgotten first; a block is known on every engine that holds "
        "it (as the Gateway API Inference Extension's prefix indexer, whose default "
        "`lruCapacityPerServer` this is: about an engine's HBM in 16-token blocks; about 200 "
        "bytes a block)",
        default=31_250)
    prefix_block_tokens: int = key(
        Integer(1, 4096), "`prefix_placement` or `book_uncached_prefill` in ext_proc: the "
        "prompt is hashed in blocks of this many tokens, counted as `bytes_per_token` bytes of "
        "its text each (no tokenizer, as the Gateway API Inference Extension's prefix scorer), "
        "its first 256 blocks only: 128 covers a 32k-token template", default=128)
    book_uncached_prefill: bool = key(
        Boolean(), "the load board books a placed request's prefill as the prompt tokens its "
        "engine must compute: the prompt less the leading blocks that engine already holds "
        "(a shared system prompt or template), exactly where the engines' KV events tell it, "
        "else from what the gateway placed (`prefix_index_blocks`). `false`: a new session is "
        "booked as its whole prompt. Live, ext_proc reads the body only for placements, as "
        "for `prefix_placement`", default=False)
    hbm_estimate: str = key(
        Choice(HBM_ESTIMATES), "where the engines publish no KV events (`kv_events_port`): "
        "`routed` estimates what each engine's HBM still holds from what this router sent "
        "there (per engine, its sessions in order of their last turn against "
        "`engine_cost.hbm_tokens`, the prefix every session placed there shares counted once; "
        "what falls past capacity, least recently used first, is taken as evicted, as vLLM "
        "evicts), and prices and books a kept session's reload from the DDR pool with it, as "
        "with KV events. Live, ext_proc then reads the body of a placement (as for "
        "`prefix_placement`) for its leading blocks. `none`: a kept session's context is taken "
        "as all in HBM", default="none")
    board_from_reports: bool = key(
        Boolean(), "an engine's backlog is its latest report (its waiting requests), aged, "
        "plus what this router booked there since; the router's own ledger counts only up to "
        "the largest prefill booked before the report (one the report shows as running). "
        "`false`: the larger of report and ledger, and the ledger never learns it booked too "
        "much or too little (docs/journal/load-gate.md, bank-coding 4x). Without a fresh "
        "report the ledger is used", default=False)
    source: str = key(
        Choice(LOAD_SOURCES), "where each ext_proc replica gets the engines' load: `scrape` "
        "(it scrapes every active engine's `/metrics` itself: replicas × engines scrapes per "
        "`refresh_s`) or `collector` (the control-plane leader scrapes each engine once per "
        "`refresh_s` and streams the figures, with their ages, to every replica over the admin "
        "API; while it is unreachable the gate falls back to static stickiness, shown by "
        "`kvgate status` and `kvgate_ext_proc_fleet_collector_reachable`)", default="scrape")
    collector: tuple[HostPort, ...] = key(
        ListOf(Address()), "`source: collector`: the control planes' admin APIs an ext_proc "
        "replica asks for the stream, tried in turn (only the leader streams); empty: "
        "`control_plane.admin`. Off loopback the replica sends `KVGATE_ADMIN_READ_TOKEN` (or "
        "`KVGATE_ADMIN_TOKEN`); over TLS when `KVGATE_ADMIN_CA` names the CA that signed the "
        "admin API's certificate (`--admin-tls-cert`), as for the CLI, else in plain text",
        default=(), default_doc="`[]` (`control_plane.admin`)")
    kv_events_port: int = key(
        Integer(0, 65535), "`source: collector`: each engine's KV cache event publisher, on "
        "the engine's host at this port (vLLM's `--kv-events-config` endpoint `tcp://*:PORT`); "
        "the collector reads every engine's stream and tells each replica how much of a "
        "session's context its engine's HBM still holds (sessions whose id reaches vLLM as "
        "`X-Session-ID`), which the gate prices staying with. 0: no events", default=0)
    kv_events_port_offset: int = key(
        Integer(-65535, 65535), "... or at the engine's own port plus this (several engines "
        "on one host: `kvgate emulate --kv-events-port` numbers them so). 0: not used",
        default=0)
    kv_events_replay_offset: int = key(
        Integer(-65535, 65535), "... and its replay socket (vLLM's `replay_endpoint`) at the "
        "publisher's port plus this: after a gap in an engine's stream the collector asks it "
        "for the messages missed, and forgets what that engine's HBM holds only when it no "
        "longer has them. 0: no replay (a gap forgets the engine)", default=0)
    refresh_s: float = key(Duration(0.01, 60.0), "how often each active engine's `/metrics` is "
                           "scraped: by each ext_proc replica (`source: scrape`) or by the "
                           "collector (`source: collector`)", default=0.1)
    max_load_age_s: float = key(Duration(0.01, 3600.0), "an engine's report older than this "
                                "counts for nothing (at least `refresh_s`)", default=2.0)
    bytes_per_token: float = key(Number(0.1, 1000.0), "request body bytes per prompt token: the "
                                 "prompt-size estimate from `content-length`", default=4.0)

    @property
    def feed(self) -> str | None:
        """Where ext_proc gets the engines' load (`source`); None: the gate is off, so nothing
        feeds or scores (static stickiness)."""
        return self.source if self.enabled else None

    @property
    def reads_prompts(self) -> bool:
        """ext_proc may ask for a request's body: the prefix step, or booking a placed prompt
        less what its engine holds, live."""
        return self.enabled and (self.prefix_placement or self.book_uncached_prefill
                                 or (self.hbm_estimate == ROUTED and not self.kv_events))

    @property
    def request_headers(self) -> tuple[str, ...]:
        """The request headers the gate reads besides the session's: `content-length`, its
        estimate of the prompt's size, when on."""
        return ("content-length",) if self.enabled else ()

    def turned(self, on: bool) -> GateConfig:
        """These settings with the gate on or off."""
        return replace(self, enabled=on)

    @property
    def kv_events(self) -> bool:
        """The engines publish KV cache events the collector reads."""
        return bool(self.kv_events_port or self.kv_events_port_offset)

    @property
    def kv_event_ports(self) -> tuple[int, int, int]:
        """Where each engine publishes its KV events: (`kv_events_port`, `_port_offset`,
        `_replay_offset`)."""
        return self.kv_events_port, self.kv_events_port_offset, self.kv_events_replay_offset

    def prompt_tokens(self, body_bytes: int) -> int:
        """A prompt's tokens, estimated from its request body's size (`bytes_per_token`)."""
        return int(body_bytes / self.bytes_per_token)

    def events_at_offsets(self, offset: int, replay_offset: int) -> GateConfig:
        """These settings reading each engine's KV events at its own port plus `offset`, its
        replay socket at that plus `replay_offset`."""
        return replace(self, kv_events_port=0, kv_events_port_offset=offset,
                       kv_events_replay_offset=replay_offset)

    def collectors(self, admin: HostPort) -> tuple[HostPort, ...]:
        """The admin APIs a replica asks for the collector's stream: `collector`, else
        `admin` (`control_plane.admin`)."""
        return self.collector or (admin,)

    def clears(self, saving_s: float, stay_s: float) -> bool:
        """A move saving `saving_s` of a session's `stay_s` estimate on its own engine saves
        enough: `min_saving_s`, and `min_saving_ratio` of `stay_s`."""
        return not (saving_s < self.min_saving_s or saving_s < self.min_saving_ratio * stay_s)

    def cooling(self, moved_at: float | None, now: float) -> bool:
        """A session the gate moved at `moved_at` (None: never) stays put at `now`
        (`cooldown_s`)."""
        return moved_at is not None and now - moved_at < self.cooldown_s

    def scored(self, ring: Sequence[T]) -> Sequence[T]:
        """The ring's candidates a decision scores: its first `candidates`."""
        return ring[: self.candidates]

    def without_miss_safe(self) -> GateConfig:
        """These settings pricing every move as a DDR read (`miss_safe` off; a diagnostic's
        counterfactual, simulator.peak_probe)."""
        return replace(self, miss_safe=False)

    def without_saving_ratio(self) -> GateConfig:
        """These settings with no `min_saving_ratio` (0: `min_saving_s` alone; a diagnostic's
        counterfactual, simulator.peak_probe)."""
        return replace(self, min_saving_ratio=0.0)

    def without_move_thresholds(self) -> GateConfig:
        """These settings taking any sooner sibling: no saving threshold, no `miss_safe`
        doubt (a diagnostic's counterfactual, simulator.move_probe)."""
        return replace(self, min_saving_s=-1e9, min_saving_ratio=-1e9, miss_safe=False)

    def with_default_move_thresholds(self) -> GateConfig:
        """These settings with the default `min_saving_s`, `min_saving_ratio` and
        `miss_safe`."""
        defaults = GateConfig()
        return replace(self, min_saving_s=defaults.min_saving_s,
                       min_saving_ratio=defaults.min_saving_ratio, miss_safe=defaults.miss_safe)

    def at_time_scale(self, time_scale: float) -> GateConfig:
        """For engines emulated at `time_scale` (> 0) and priced in wall seconds: the gate's
        emulated seconds scaled with them; how often and how old a report stays wall time."""
        return replace(self, min_saving_s=self.min_saving_s * time_scale,
                       cooldown_s=self.cooldown_s * time_scale)


# The keys that change a decision, not how the gate is fed: the simulator's `--gate-*` flags and
# a result's `load_gate` (simulator.command).
DECISION_KEYS = tuple(e for e in entries(GateConfig) if e.attr in (
    "min_saving_s", "min_saving_ratio", "cooldown_s", "candidates", "miss_safe", "terms",
    "prefix_placement", "prefix_index_blocks", "book_uncached_prefill", "board_from_reports",
    "hbm_estimate"))


_NEWER_KEYS = ("terms", "prefix_placement", "prefix_index_blocks", "book_uncached_prefill",
               "board_from_reports", "hbm_estimate")


def decision_settings(gate: GateConfig) -> dict[str, Any]:
    """`gate`'s decision keys, for a result's JSON: the newer keys only when not at their
    defaults, so results from before those keys read as they did."""
    defaults = GateConfig()
    described = {e.attr: getattr(gate, e.attr) for e in DECISION_KEYS
                 if e.attr not in _NEWER_KEYS or getattr(gate, e.attr) != getattr(defaults, e.attr)}
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in described.items()}


def _check_gate(f: Fields, gate: GateConfig, path: Path) -> None:
    if not gate.terms:
        f.error((*path, "terms"), "at least one term: an empty score ranks every endpoint "
                "alike")
    elif len(set(gate.terms)) != len(gate.terms):
        f.error((*path, "terms"), f"a term listed twice: {list(gate.terms)}")
    if gate.kv_events_port and gate.kv_events_port_offset:
        f.error((*path, "kv_events_port_offset"), "set kv_events_port or kv_events_port_offset, "
                "not both")
    events = "kv_events_port" if gate.kv_events_port else (
        "kv_events_port_offset" if gate.kv_events_port_offset else None)
    if gate.kv_events_replay_offset and events is None:
        f.error((*path, "kv_events_replay_offset"), "a replay socket belongs to an event "
                "publisher: set kv_events_port or kv_events_port_offset too")
    if events is not None and gate.source != "collector":
        f.error((*path, events), "KV events are read by the collector: needs source: collector, "
                f"got source: {gate.source}")
    if (gate.max_load_age_s < gate.refresh_s and not f.failed((*path, "refresh_s"))
            and not f.failed((*path, "max_load_age_s"))):
        f.error((*path, "max_load_age_s"),
                f"must be at least refresh_s ({gate.refresh_s:g}s), got {gate.max_load_age_s:g}s:"
                " every engine report would be stale before the next one arrives")


describe(
    EngineCost,
    prefill_tokens_per_s=Key(Number(1.0, 1e9), "the engines' prefill rate (tokens/s)"),
    prefill_overhead_s=Key(Duration(0.0, 600.0), "a prefill's fixed cost: scheduling, "
                           "sampling, the first step's launch"),
    kv_bytes_per_token=Key(Size(1, 1 << 30), "KV cache bytes per token"),
    ddr_gbps=Key(Number(0.001, 1e6), "one device's link from the DDR pool (GB/s)"),
    node_gbps=Key(Number(0.0, 1e6), "a node's link from the DDR pool, shared by the engines on "
                  "one host (GB/s; 0: none but each device's). Priced by the `link_backlog` "
                  "term only"),
    transfer_fixed_s=Key(Scaled(0.0, 60_000.0, 1000.0, "ms"), "a DDR transfer's fixed cost: "
                         "pool lookup, RDMA set-up, scatter into the paged cache",
                         name="transfer_fixed_ms"),
    hbm_tokens=Key(Integer(1, 1 << 40), "one engine's HBM for KV cache, in tokens (vLLM: "
                   "`num_gpu_blocks` × `block_size`, its `cache_config_info` metric). Read by "
                   "`load_gate.hbm_estimate` only. `kvgate up` with emulated engines: their "
                   "HBM (`--hbm-tokens`) unless set here"),
    pool_load=Key(Choice(POOL_LOADS), "how the engines' KV connector loads a hit from the DDR "
                  "pool (vLLM's `load_kv_async`): `async`, the read runs while the request "
                  "waits (vLLM's OffloadingConnector, MooncakeStoreConnector; AscendStore with "
                  "`load_async: true`); `in_step`, the worker reads before the step's forward and "
                  "the engine waits for it (vLLM-Ascend's AscendStoreConnector and vLLM's "
                  "LMCacheConnectorV1 by default): the gate books a read as engine time"),
    prompt_s_per_token=Key(Scaled(0.0, 1e6, 1e6, "µs"), "per prompt token, cached or not: "
                           "what the engine does with the whole prompt before its prefill "
                           "(tokenizing, hashing its blocks, looking them up; the emulator's "
                           "`--prompt-us-per-token`)", name="prompt_us_per_token"),
)


@dataclass(frozen=True, slots=True)
class Placement:
    load_factor: float = key(
        Number(1.0, 100.0), "bounded load: no endpoint holds more than this × its weighted "
        "share of the pool's sessions (1.0 = perfectly even), also when sessions move",
        default=1.25)
    load_gate: GateConfig = key(Section(GateConfig, check=_check_gate),
                                "the load gate's thresholds and feed", factory=GateConfig)
    engine_cost: EngineCost = key(
        Section(EngineCost), "the engines' speed the gate prices requests with. Defaults are "
        "the emulator's engine (a 32B-class model on one device). `kvgate up` with an emulated "
        "fleet passes the emulator's figures at its `--time-scale` (and scales `min_saving_s` "
        "and `cooldown_s` with it) unless the YAML sets `engine_cost`", factory=EngineCost)
