"""What a request costs an engine, in seconds: the prices the load gate compares.

An engine prefills one request at a time (a saturated chunked-prefill budget): a request's time to
first token is the prefill work queued ahead of it, then its own prefill (a fixed cost plus its
uncached tokens at the prefill rate). Context read from the DDR pool travels while the request
waits (vLLM's asynchronous KV connectors), so it costs only what the queue does not hide; a
connector that loads inside the step (`pool_load: in_step`) holds its engine for the read. The
load gate's terms (`kvgate.routing.terms`) add these up.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
# EngineCost.pool_load's values: how the engines' KV connector loads a hit from the DDR pool
# (vLLM `get_num_new_matched_tokens`' second value, `load_kv_async`).
POOL_LOAD_ASYNC, POOL_LOAD_IN_STEP = "async", "in_step"
POOL_LOADS = (POOL_LOAD_ASYNC, POOL_LOAD_IN_STEP)


@dataclass(frozen=True, slots=True)
class EngineCost:
    """An engine's speed and its link from the DDR pool. The defaults are the emulator's engine
    (a 32B-class model on one device, docs/benchmarks.md) and its pool links."""

    prefill_tokens_per_s: float = 5000.0
    prefill_overhead_s: float = 0.02  # c0: scheduling, sampling, the first step's launch
    kv_bytes_per_token: int = 256 * 1024
    ddr_gbps: float = 20.0  # one device's link from the pool
    transfer_fixed_s: float = 0.003  # pool lookup, RDMA set-up, scatter into the paged cache
    # Per prompt token, cached or not: what an engine does with the whole prompt before its
    # prefill (the emulator's TimingParams.prompt_s_per_token, which cites vLLM's rendering,
    # block hashing and prefix lookup). 0 in the defaults, as in the emulator's.
    prompt_s_per_token: float = 0.0
    # A node's link from the pool, shared by its devices (emulator/transfer.py, TransferParams:
    # 144 GB/s for 8 devices); 0: none but its devices' own. Read by the link backlog
    # (kvgate.placement.links) only.
    node_gbps: float = 144.0
    # One engine's HBM for KV, in tokens: the emulator's default (emulator/options.py,
    # DEFAULT_HBM_TOKENS). Read by the gate's estimate of what HBM holds (kvgate.placement.
    # routed_hbm) only.
    hbm_tokens: int = 550_000
    # POOL_LOAD_ASYNC: the read runs while the request waits, the engine serving others;
    # POOL_LOAD_IN_STEP: the worker reads before the forward of the step that schedules the
    # request (vLLM kv_connector_model_runner_mixin.py: "Sync loads feed this step's forward so
    # must precede it"; vLLM-Ascend's AscendStoreConnector and vLLM's LMCacheConnectorV1 by
    # default, docs/journal/small-fleet.md), so the engine does nothing else meanwhile. Read
    # by the gate's ledger (kvgate.routing.booking) only.
    pool_load: str = POOL_LOAD_ASYNC

    def prefill_s(self, uncached_tokens: int, prompt_tokens: int) -> float:
        """One request's own prefill: c0, the per-token cost of its whole prompt, and its
        uncached tokens at the prefill rate (the emulator's TimingParams.prefill_s)."""
        return (self.prefill_overhead_s + max(0, prompt_tokens) * self.prompt_s_per_token
                + max(0, uncached_tokens) / self.prefill_tokens_per_s)

    def transfer_s(self, tokens: int) -> float:
        """Reading `tokens` of context from the DDR pool into HBM, the link to itself."""
        if tokens <= 0:
            return 0.0
        return self.transfer_fixed_s + tokens * self.kv_bytes_per_token / (self.ddr_gbps * GB)
