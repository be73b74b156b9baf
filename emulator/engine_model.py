"""One engine instance's model: prefix cache + DDR lookups + timing + vLLM-style counters.

Pure: no I/O, no clock of its own; every call takes ``now`` in emulated seconds. The DDR pool is
consulted by the caller between :meth:`EngineModel.probe` and :meth:`EngineModel.admit`, so the
same model serves a live instance (pool behind HTTP, awaited) and a discrete-event simulator (pool
model called directly).

A request goes: ``probe`` (HBM hit) -> caller looks ``probe.pool_hashes`` up in the pool (past
``probe.hbm_blocks``) -> ``admit`` (pins blocks, schedules, counts) -> caller hands the prompt's
blocks ``admission.to_pool`` to the pool at the first token and ``admission.answer`` at the end
(the pool's connector profile decides what it writes) -> ``finish`` when the response is over
(unpins now, if the schedule has not yet), or ``abort`` when its client went away before its end.

As in vLLM v1, the full blocks of generated tokens are cached too (``output_hashes``: the chain
continued over the prompt's partial block and the answer), so a client that sends the answer back
in its next prompt finds it; they are held from admission, like the prompt's.

As in vLLM, a waiting request holds no KV blocks and is matched against the cache when it is
scheduled, not when it arrives: the cache is brought forward to the request's prefill start
(releasing what finished by then) before the lookup, and its blocks are pinned from then until
its last token. The schedule is closed form, so both instants are known at admission.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from emulator.prefix_cache import Hold, PrefixCache, block_hashes, max_hit_blocks, root_hash
from emulator.steps import StepScheduler
from emulator.timing import VLLM_STEPS, Scheduler, Slot, TimingParams

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an instance is: model name, cache geometry and speed."""

    model: str = "Qwen/Qwen2.5-32B-Instruct"
    block_size: int = 16
    hbm_tokens: int = 550_000
    timing: TimingParams = field(default_factory=TimingParams)
    # False: no queueing at all (time scale 0); every request starts on arrival.
    queueing: bool = True


class Probe(NamedTuple):
    """Result of the HBM lookup for one prompt."""

    hashes: list[int]  # chained hashes of the prompt's full blocks
    num_tokens: int
    hbm_blocks: int  # leading blocks found in HBM (n-1 cap applied)
    limit_blocks: int  # n-1 cap in blocks
    cache_version: int | None = None  # the cache's version then (admit re-matches if changed)
    prefill_start: float = 0.0  # the instant the cache was looked up at

    @property
    def pool_hashes(self) -> list[int]:
        """The blocks a connector may look up in the DDR pool: the prompt's, up to the cap
        (which of them it asks for, its profile says; those past ``hbm_blocks`` are loaded)."""
        return self.hashes[: self.limit_blocks]

    @property
    def ddr_candidates(self) -> list[int]:
        """The blocks a hit in the pool would load: those after the HBM hit, up to the cap."""
        return self.hashes[self.hbm_blocks : self.limit_blocks]


class Admission(NamedTuple):
    """A scheduled request: where its prompt came from and when its tokens come out."""

    hashes: list[int]  # every block it holds: the prompt's, then its answer's
    extra_blocks: int
    prompt_tokens: int
    hbm_hit_tokens: int
    ddr_hit_tokens: int
    output_tokens: int
    slot: Slot
    to_pool: list[int]  # the prompt's full blocks, offered to the DDR pool after prefill
    ticket: int = 0  # which pinning this is, for an early finish
    hold: Hold | None = None  # what the cache pinned, to unpin without looking it up again
    hbm_blocks: int = 0  # leading prompt blocks taken from HBM
    ddr_blocks: int = 0  # ... then from the DDR pool

    @property
    def answer(self) -> list[int]:
        """The answer's full blocks (the engine caches them; some connectors save them)."""
        return self.hashes[len(self.to_pool) :]

    @property
    def cached_tokens(self) -> int:
        """``usage.prompt_tokens_details.cached_tokens``: HBM plus DDR (external) hits."""
        return self.hbm_hit_tokens + self.ddr_hit_tokens


@dataclass(slots=True)
class Histogram:
    """Cumulative-free bucket counts (exported cumulatively) plus sum and count."""

    bounds: tuple[float, ...] = TTFT_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        """Record one value."""
        self.counts[bisect_left(self.bounds, value)] += 1  # first bound >= value
        self.total += value
        self.count += 1


@dataclass(slots=True)
class EngineStats:
    """vLLM's counters, in tokens where vLLM counts tokens."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    ttft: Histogram = field(default_factory=Histogram)


class EngineModel:
    """Prefix cache, scheduler and counters of one instance."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.cache = PrefixCache(config.hbm_tokens, config.block_size)
        self.scheduler: Scheduler | StepScheduler = (
            StepScheduler(config.timing) if config.timing.scheduler == VLLM_STEPS
            else Scheduler(config.timing.max_num_seqs))
        self.stats = EngineStats()
        self.root = root_hash(config.model, config.block_size)
        self._inflight = 0
        # Pinned requests by ticket, and (instant their blocks are unpinned, ticket); the cache
        # reflects every start and finish up to ``_cache_time``.
        self._pinned: dict[int, Admission] = {}
        self._unpin_at: list[tuple[float, int]] = []
        self._tickets = 0
        self._cache_time = float("-inf")

    def hashes(self, tokens: Sequence[int]) -> list[int]:
        """Chained block hashes of a prompt for this instance's model and block size."""
        return block_hashes(tokens, self.config.block_size, self.root)

    def probe(self, now: float, tokens: Sequence[int]) -> Probe:
        """Look up in HBM a prompt arriving at ``now``, as the cache will be at its prefill."""
        return self.probe_hashes(now, self.hashes(tokens), len(tokens))

    def probe_hashes(self, now: float, hashes: list[int], num_tokens: int) -> Probe:
        """Like :meth:`probe`, for callers that already have block hashes (trace replay)."""
        limit = max_hit_blocks(num_tokens, self.config.block_size)
        start = self._prefill_start(now)
        self._advance(start)
        cache = self.cache
        return Probe(hashes, num_tokens, cache.match(hashes, limit), limit, cache.version, start)

    def output_hashes(self, prompt: Sequence[int], probe: Probe,
                      output: Sequence[int]) -> list[int]:
        """Blocks the engine caches of the answer ``output`` to ``prompt``: the full ones of
        prompt + answer past the prompt's full blocks, without the last token (whose KV is never
        computed, as in vLLM)."""
        bs = self.config.block_size
        full = len(probe.hashes)
        parent = probe.hashes[-1] if probe.hashes else self.root
        tail = [*prompt[full * bs :], *output[: max(0, len(output) - 1)]]
        return block_hashes(tail, bs, parent)

    def _prefill_start(self, now: float) -> float:
        return self.scheduler.prefill_start(now) if self.config.queueing else now

    def _advance(self, when: float) -> None:
        """Bring the cache to emulated time ``when``: unpin the requests finished by then."""
        if when <= self._cache_time:
            return  # time never goes back: later requests start their prefill later
        self._cache_time = when
        due = self._unpin_at
        while due and due[0][0] <= when:
            self._unpin(heapq.heappop(due)[1])

    def _unpin(self, ticket: int) -> None:
        admission = self._pinned.pop(ticket, None)
        if admission is not None:  # None: finished early
            self.cache.release(admission.hashes, admission.extra_blocks, admission.hold)

    def admit(
        self,
        now: float,
        probe: Probe,
        max_tokens: int,
        ddr_hit_blocks: int | None = None,
        output_hashes: Sequence[int] = (),
        arrival: float | None = None,
    ) -> Admission:
        """Pin the prompt's blocks, schedule the request and count it.

        ``ddr_hit_blocks`` is the pool's answer (blocks it serves past ``probe.hbm_blocks``), or
        ``None`` when
        there is no pool (external counters then stay still, as in vLLM without a connector).
        ``output_hashes`` (see :meth:`output_hashes`) are cached with the prompt's blocks.
        ``arrival``: the request arrived then and its DDR blocks were loaded by ``now`` (the
        transfer model timed that, overlapping other requests' prefills, as vLLM's asynchronous
        KV connectors do); its TTFT counts from ``arrival``. Without it, the DDR load is timed
        at ``TimingParams.ddr_bytes_per_s`` inside the prefill, as before transfers were modelled.
        """
        bs = self.config.block_size
        cache = self.cache
        self._advance(self._prefill_start(now))
        hbm_blocks, ddr_blocks = self._hits(probe, ddr_hit_blocks)
        n = probe.num_tokens
        computed = n - (hbm_blocks + ddr_blocks) * bs
        # The partial last block and the rest of the answer take blocks too, never cached.
        total_blocks = -(-(n + max_tokens) // bs)
        held = [*probe.hashes, *output_hashes] if output_hashes else probe.hashes
        extra = max(0, total_blocks - len(held))
        hold = cache.acquire(held, extra)
        slot = self._schedule(now, computed, 0 if arrival is not None else ddr_blocks * bs,
                              max_tokens, arrival, n)
        self._inflight += 1
        self._count(n, max_tokens, hbm_blocks * bs,
                    None if ddr_hit_blocks is None else ddr_blocks * bs, slot)
        self._tickets += 1
        admission = Admission(
            hashes=held,
            extra_blocks=extra,
            prompt_tokens=n,
            hbm_hit_tokens=hbm_blocks * bs,
            ddr_hit_tokens=ddr_blocks * bs,
            output_tokens=max_tokens,
            slot=slot,
            to_pool=probe.hashes,
            ticket=self._tickets,
            hold=hold,
            hbm_blocks=hbm_blocks,
            ddr_blocks=ddr_blocks,
        )
        self._pinned[self._tickets] = admission
        heapq.heappush(self._unpin_at, (slot.finish, self._tickets))
        return admission

    def _hits(self, probe: Probe, ddr_hit_blocks: int | None) -> tuple[int, int]:
        """``(HBM blocks, DDR blocks)`` the prompt hits now. The cache may have changed while
        the caller awaited the pool: re-match, and count as DDR hits only the pool blocks
        beyond what HBM has now."""
        if probe.cache_version is not None and probe.cache_version == self.cache.version:
            hbm_blocks = probe.hbm_blocks
        else:
            hbm_blocks = self.cache.match(probe.hashes, probe.limit_blocks)
        ddr_end = probe.hbm_blocks + (ddr_hit_blocks or 0)
        return hbm_blocks, max(0, ddr_end - hbm_blocks)

    def _schedule(self, now: float, computed: int, ddr_tokens: int, max_tokens: int,
                  arrival: float | None, prompt_tokens: int) -> Slot:
        """The request's slot: prefill of ``computed`` tokens (plus ``ddr_tokens`` loaded inside
        it), then the decode; its TTFT counts from ``arrival`` when given."""
        timing = self.config.timing
        prefill_s = timing.prefill_seconds(computed, ddr_tokens, prompt_tokens)
        decode_s = timing.decode_seconds(max_tokens)
        scheduler = self.scheduler
        if self.config.queueing and isinstance(scheduler, StepScheduler):
            load_s = ddr_tokens * timing.kv_bytes_per_token / timing.ddr_bytes_per_s
            slot = scheduler.schedule(now, computed, max_tokens, load_s, prompt_tokens)
        elif self.config.queueing and isinstance(scheduler, Scheduler):
            slot = scheduler.schedule(now, prefill_s, decode_s)
        else:
            slot = Slot(now, now, now, now + prefill_s, now + prefill_s + decode_s)
        if arrival is not None:
            slot = slot._replace(arrival=arrival)
        return slot

    def _count(self, prompt_tokens: int, max_tokens: int, hbm_hit_tokens: int,
               ddr_hit_tokens: int | None, slot: Slot) -> None:
        """vLLM's counters for one admitted request (``ddr_hit_tokens`` None: no pool, so the
        external counters stay still, as in vLLM without a connector)."""
        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += prompt_tokens
        stats.generation_tokens += max_tokens
        stats.prefix_cache_queries += prompt_tokens
        stats.prefix_cache_hits += hbm_hit_tokens
        if ddr_hit_tokens is not None:
            stats.external_prefix_cache_queries += prompt_tokens
            stats.external_prefix_cache_hits += ddr_hit_tokens
        # Known at admission because the schedule is closed-form.
        stats.ttft.observe(slot.ttft)

    def finish(self, admission: Admission) -> None:
        """The response is over or abandoned: unpin its blocks now if the schedule has not.

        A discrete-event caller need not call it; blocks are unpinned at ``slot.finish``."""
        self._inflight -= 1
        self._unpin(admission.ticket)

    def abort(self, admission: Admission, now: float) -> None:
        """The client went away at ``now``, before the answer's end: as vLLM aborts such a
        request (``AsyncLLM.abort``: the scheduler frees its blocks and its place), it stops
        counting as running or waiting, what it had not used of its slot and of the engine's
        steps goes to later arrivals, and its blocks are unpinned now. Call it instead of
        :meth:`finish`."""
        if self.config.queueing:
            self.scheduler.release(admission.slot, now)
        self.finish(admission)

    def token_interval(self, slot: Slot, tokens: int) -> float:
        """Time between two streamed tokens: the decode time per token, or, under the step
        model (whose steps differ in length), the slot's decode spread evenly."""
        if isinstance(self.scheduler, StepScheduler) and tokens > 1:
            return (slot.finish - slot.first_token) / (tokens - 1)
        return self.config.timing.decode_s_per_token

    def usage(self, now: float) -> float:
        """``vllm:kv_cache_usage_perc`` at ``now`` (or at the latest scheduled prefill)."""
        self._advance(now)
        return self.cache.usage()

    def occupancy(self, now: float) -> tuple[int, int]:
        """``(running, waiting)`` for ``vllm:num_requests_running`` / ``_waiting``."""
        if self.config.queueing:
            return self.scheduler.occupancy(now)
        return self._inflight, 0
