"""Routing modes: how the gateway spreads requests over the engines. Only the affinity modes are
kvgate; the others are the baselines users compare it with. One enum for everything that names a
mode: the xDS builders (`kvgate envoy-config --mode`), `kvgate bench --compare`, `kvgate simulate`
and `kvgate plan`."""

from __future__ import annotations

from enum import StrEnum


class RoutingMode(StrEnum):
    ROUND_ROBIN = "round_robin"  # the bank's old setup: any request to any engine
    RING_HASH = "ring_hash"  # plain Envoy ring_hash on the session header
    AFFINITY = "affinity"  # kvgate (ext_proc + bindings, ring_hash fallback), no DDR pool
    ROUND_ROBIN_DDR = "round_robin+ddr"  # Envoy round robin, engines sharing a DDR KV pool
    AFFINITY_DDR = "affinity+ddr"  # kvgate (load-aware), engines sharing a DDR KV pool
    STICKY_DDR = "sticky+ddr"  # kvgate with the load gate off: static stickiness
    # The peers' policies, on the same fleet with the same DDR pool (simulated only):
    PREFIX_SCORE = "prefix-score"  # llm-d-style prefix, queue and KV-usage scoring
    KV_COST = "kv-cost"  # Dynamo-style: prefill blocks to compute + active blocks
    BOUNDED_HASH = "bounded-hash"  # bounded-load consistent hashing on the session id

    @property
    def ddr_pool(self) -> bool:
        """The engines share a DDR KV pool: a property of the fleet, not of Envoy's config."""
        return self not in (RoutingMode.ROUND_ROBIN, RoutingMode.RING_HASH, RoutingMode.AFFINITY)

    @property
    def round_robin(self) -> bool:
        """Envoy's round robin routes (with or without a pool behind the engines)."""
        return self in (RoutingMode.ROUND_ROBIN, RoutingMode.ROUND_ROBIN_DDR)

    @property
    def uses_ext_proc(self) -> bool:
        """ext_proc picks the engine (with etcd and the control plane); else Envoy alone."""
        return self in (RoutingMode.AFFINITY, RoutingMode.AFFINITY_DDR, RoutingMode.STICKY_DDR)

    @property
    def load_aware(self) -> bool:
        """kvgate's load gate is on (`placement.load_gate.enabled`)."""
        return self in (RoutingMode.AFFINITY, RoutingMode.AFFINITY_DDR)

    @property
    def simulated_only(self) -> bool:
        """The peers' policies: they score prompts' blocks, which kvgate keeps out of ext_proc,
        so they run in `kvgate simulate` and `kvgate plan` only."""
        return self in (RoutingMode.PREFIX_SCORE, RoutingMode.KV_COST, RoutingMode.BOUNDED_HASH)


class PdMode(StrEnum):
    """Routing over a prefill/decode-disaggregated fleet (`kvgate simulate --pd P:D`): which
    engine prefills a turn and which decodes it. kvgate's and the peers' policies, simulated."""

    KVGATE = "pd-kvgate"  # decode engine by the session's binding, skip prefill when cached
    VLLM_ASCEND = "pd-vllm-ascend"  # vLLM-Ascend's load-balance proxy: both by load, never skips
    LLM_D = "pd-llm-d"  # llm-d: decode first, remote prefill past nonCachedTokens
    DYNAMO = "pd-dynamo"  # Dynamo: prefill by KV overlap, decode by load, conditional disagg

    @property
    def ddr_pool(self) -> bool:
        """The prefill engines share the DDR pool (the decode engines use none by default)."""
        return True
