"""How a real KV connector fills, refreshes and evicts the shared DDR pool, as named profiles.

One definition for the emulator (``kvgate emulate``, ``kvgate up``'s fleet) and the simulator
(``kvgate simulate``, ``plan``, ``bench --compare``). A profile fixes three things:

- the lookup: which of a prompt's blocks the connector asks the pool for (the whole prompt, or
  only those past the engine's HBM hit) and what that does to them (refreshes their recency,
  grants a read lease, or nothing);
- the store: which of the prompt's blocks a request offers (the pool puts those it lacks; putting
  one it holds refreshes nothing in any of the four), whether the existence check before the put
  leases what is there, its decode blocks or not, and a refresh once the request is over;
- eviction: least recently used at watermarks (or only when full), or leases with a TTL and a
  share of the blocks evicted at a time, oldest lease first.

Each also records how its connector loads a hit into HBM (``kv_load``: between steps, or inside
the step that schedules the request); the simulator's ``--pool-read-order connector`` follows it
(``simulator/read_order.py``). docs/journal/small-fleet.md ("Which connectors load as
read_order.py models") has the sources.

Every rule cites the code it is taken from in ``SOURCES`` below and in docs/pool-profiles.md ("The
DDR pool as the connectors fill it"); a rule changed for any other reason is a defect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class LookupScope(StrEnum):
    """Which of a prompt's blocks a lookup asks the pool for (the hit is the leading run the
    pool holds from there; the blocks it serves are those past the engine's HBM hit)."""

    PROMPT = "prompt"  # every block of the prompt from the first, the HBM hit included
    PAST_HBM = "past_hbm"  # only the blocks past the engine's HBM hit


class Refresh(StrEnum):
    """What a lookup does to the blocks it finds."""

    HITS = "hits"  # every hit up to the first miss becomes most recently used
    LEASE_ALL = "lease_all"  # every block asked for that the pool holds gets a read lease
    LOADED = "loaded"  # only the blocks read into HBM become most recently used
    NONE = "none"  # nothing


class StoreScope(StrEnum):
    """Which of a prompt's blocks a request offers the pool once its prefill is done (the pool
    puts those it lacks)."""

    PROMPT = "prompt"  # every full block of the prompt, the HBM hit included
    PAST_LOAD = "past_load"  # all of them, or, after a load from the pool, those past it


class KvLoad(StrEnum):
    """How the connector loads a pool hit into HBM under its default settings: the second value
    of its ``get_num_new_matched_tokens`` (vLLM ``KVConnectorBase_V1``, ``load_kv_async``)."""

    ASYNC = "async"  # True: the request waits in WAITING_FOR_REMOTE_KVS, others pass it
    IN_STEP = "in_step"  # False: scheduled at once; the worker loads before the step's forward


class Eviction(StrEnum):
    """How the pool makes room."""

    LRU = "lru"  # least recently used first, from the high watermark down to the low one
    LEASE = "lease"  # oldest lease first among blocks whose lease ran out, a share at a time


@dataclass(frozen=True, slots=True)
class PoolProfile:
    """One connector's rules; see the module docstring."""

    name: str
    lookup_scope: LookupScope
    lookup_refresh: Refresh
    store_scope: StoreScope
    store_leases: bool  # the existence check before a put leases the blocks already there
    store_decode: bool  # the answer's full blocks are written at the request's end
    touch_at_end: bool  # the blocks loaded or offered are refreshed once, at the request's end
    head_last: bool  # a refresh walks the prompt tail first: its head ends most recently used
    eviction: Eviction
    high_watermark: float  # eviction starts once the pool holds more than this share
    low_watermark: float  # LRU: ... and stops at this share
    kv_load: KvLoad  # read only by the simulator's `--pool-read-order connector`
    evict_ratio: float = 0.0  # LEASE: the least share of the blocks held evicted per round
    lease_s: float = 0.0  # LEASE: how long a read lease protects a block
    chunk_tokens: int = 0  # the connector's key covers this many tokens (0: one engine block)
    summary: str = ""

    def chunk_blocks(self, block_size: int) -> int:
        """Engine blocks per pool key (a lookup's hit and a store end on a whole chunk)."""
        return max(1, self.chunk_tokens // block_size) if self.chunk_tokens else 1

    def describe(self) -> dict[str, object]:
        """The profile as a result's JSON records it."""
        return {"name": self.name, "lookup_scope": str(self.lookup_scope),
                "lookup_refresh": str(self.lookup_refresh), "store_scope": str(self.store_scope),
                "store_leases": self.store_leases, "store_decode": self.store_decode,
                "touch_at_end": self.touch_at_end, "head_last": self.head_last,
                "eviction": str(self.eviction),
                "watermarks": [self.high_watermark, self.low_watermark],
                "evict_ratio": self.evict_ratio, "lease_s": self.lease_s,
                "chunk_tokens": self.chunk_tokens}


# Each rule from the code named beside it; docs/pool-profiles.md ("The DDR pool as the connectors
# fill it") gives the versions and lines. Pins held for the few milliseconds between a lookup
# and its load or save are not modelled.
LMCACHE = PoolProfile(
    name="lmcache",
    # LMCache 0.5.6 integration/vllm/vllm_v1_adapter.py get_num_new_matched_tokens: the whole
    # request (all_token_ids) from chunk 0; storage_backend batched_contains stops at a miss.
    lookup_scope=LookupScope.PROMPT,
    # cache_engine.py LMCacheEngine.lookup(pin=True) -> local_cpu_backend.py touch_cache: every
    # hit up to the first miss, walked in reverse (the head ends most recently used).
    lookup_refresh=Refresh.HITS, head_last=True,
    # vllm_v1_adapter.py from_new_request: saving starts at LMCache's own hit; chunks already
    # held are dropped by submit_put_task without refreshing them (lru.py update_on_put).
    store_scope=StoreScope.PROMPT, store_leases=False,
    store_decode=False,  # v1/config.py save_decode_cache = False
    touch_at_end=False,
    # local_cpu_backend.py allocate: LRU, one victim at a time, only when an allocation fails.
    eviction=Eviction.LRU, high_watermark=1.0, low_watermark=1.0,
    chunk_tokens=256,  # v1/config.py chunk_size; save_unfull_chunk = False: full chunks only
    # vLLM lmcache_connector.py LMCacheConnectorV1.get_num_new_matched_tokens returns (hit,
    # False), always; vllm_v1_adapter.py start_load_kv retrieves before the forward (per layer in
    # wait_for_layer_load with use_layerwise, default False). enable_async_loading (default
    # False) makes only the lookup asynchronous.
    kv_load=KvLoad.IN_STEP,
    summary="whole-prompt lookup refreshes every hit chunk; writes the chunks the pool lacks; "
            "LRU when full; 256-token chunks",
)
MOONCAKE = PoolProfile(
    name="mooncake",
    # vLLM 0.33.0 mooncake/store/worker.py MooncakeStoreWorker.lookup: one batch_is_exist over
    # every block of the prompt from block 0; the hit is the longest present prefix.
    lookup_scope=LookupScope.PROMPT,
    # Mooncake master_service.cpp ExistKey/BatchExistKey: GrantReadLease on every key present.
    lookup_refresh=Refresh.LEASE_ALL, head_last=False,
    # worker.py KVCacheStoreSendingThread._handle_request: batch_is_exist over the prompt's
    # blocks from block 0 (which leases those present), then a put of the missing ones.
    store_scope=StoreScope.PROMPT, store_leases=True,
    store_decode=False,  # store/scheduler.py save_decode_cache = False
    touch_at_end=False,
    # master_service.cpp EvictionThreadFunc/BatchEvict: past 90 % used, at least 5 % of the
    # objects, oldest lease_timeout first among those whose lease ran out (PutEnd sets it to
    # the write time); types.h defaults (TTL 10 s since Mooncake PR 2871).
    eviction=Eviction.LEASE, high_watermark=0.90, low_watermark=0.90, evict_ratio=0.05,
    lease_s=10.0,
    # vLLM store/scheduler.py MooncakeStoreScheduler: load_async = extra config "load_async",
    # default True, returned as the second value; worker.py get_finished asserts it (the
    # synchronous load is not implemented) and hands loads to the receiving threads.
    kv_load=KvLoad.ASYNC,
    summary="whole-prompt existence check leases every block held; writes what the pool "
            "lacks; past 90 % evicts 5 % of objects, oldest lease first, never a live lease",
)
VLLM_OFFLOAD = PoolProfile(
    name="vllm-offload",
    # vLLM 0.33.0 offloading/scheduler.py _lookup_complete_chunks: from num_computed_tokens
    # (past the GPU hit), prefix scan to the first miss; cpu/manager.py lookup touches nothing.
    lookup_scope=LookupScope.PAST_HBM, lookup_refresh=Refresh.NONE,
    # scheduler.py _build_store_jobs from next_stored_chunk_idx: 0 without a CPU load, the end
    # of the loaded range after one (update_state_after_alloc, OffloadPolicy.CHUNK_LEVEL);
    # manager.py prepare_store puts only absent keys.
    store_scope=StoreScope.PAST_LOAD, store_leases=False,
    store_decode=False,  # kv_offload/base.py offload_prompt_only = True
    # cpu/manager.py on_request_finished (vLLM PR 51787): the keys loaded or offered to store
    # get one refresh at the request's end, head last.
    touch_at_end=True, head_last=True,
    # cpu/policies/lru.py (eviction_policy "lru" by default): exactly the deficit, when short.
    eviction=Eviction.LRU, high_watermark=1.0, low_watermark=1.0,
    # offloading/scheduler.py OffloadingConnectorScheduler.get_num_new_matched_tokens returns
    # (hit, True) for every hit; no setting changes it.
    kv_load=KvLoad.ASYNC,
    summary="lookup past the GPU hit; offers every prompt block (past a CPU load, if any); "
            "one refresh per request at its end; LRU when full",
)
ASCEND_STORE = PoolProfile(
    name="ascend-store",
    # vllm-ascend ascend_store/pool_worker.py lookup_scheduler/_build_lookup_keys: a
    # full-attention model checks every prompt block from block 0 (exists); only hybrid KV
    # caches start at the HBM hit (_lookup_with_coordinator).
    lookup_scope=LookupScope.PROMPT,
    # Assumed (MemCache's source is not public): an existence check refreshes nothing, a read
    # of the blocks loaded makes them most recently used, as in an LRU by access.
    lookup_refresh=Refresh.LOADED, head_last=False,
    # kv_transfer.py KVCacheStoreSendingThread._handle_stored_request: every prompt block
    # from block 0 but the range just loaded, filtered by exists, the missing ones put.
    store_scope=StoreScope.PROMPT, store_leases=False,
    store_decode=False,  # pool_scheduler.py save_decode_cache = False
    touch_at_end=False,
    # Assumed: MemCache's LRU (ock.mmc.meta_service.lru_type) between its high and low
    # thresholds, at the 90 % / 80 % its README gives (its defaults are not in code we read).
    eviction=Eviction.LRU, high_watermark=0.9, low_watermark=0.8,
    # pool_scheduler.py KVPoolScheduler.get_num_new_matched_tokens returns load_async and not
    # use_layerwise; both extra config keys default to False, so pool_worker.py start_load_kv
    # gets the blocks (m_store.get) before the forward. load_async True: asynchronous.
    kv_load=KvLoad.IN_STEP,
    summary="whole-prompt existence check; the blocks read are refreshed; writes what the "
            "pool lacks; LRU from 90 % to 80 % (MemCache's policy assumed)",
)
PROFILES: dict[str, PoolProfile] = {p.name: p for p in (ASCEND_STORE, LMCACHE, MOONCAKE,
                                                        VLLM_OFFLOAD)}
DEFAULT_PROFILE = ASCEND_STORE.name  # the bank's stack


def by_name(name: str | None) -> PoolProfile:
    """The profile called ``name`` (None: the default); ValueError names the choices."""
    try:
        return PROFILES[name or DEFAULT_PROFILE]
    except KeyError:
        raise ValueError(f"unknown pool connector {name!r} (choose from "
                         f"{', '.join(PROFILES)})") from None
