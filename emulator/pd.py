"""Prefill/decode disaggregation in the emulator: vLLM's two-stage wire, as NixlConnector has it.

Sources (vllm-project/vllm, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``):

- A prefill request carries ``kv_transfer_params: {do_remote_decode: true, ...}``, ``max_tokens:
  1``, ``stream: false``. When it finishes length-capped, ``NixlConnectorScheduler
  .request_finished`` keeps its blocks and answers ``{do_remote_prefill: true, do_remote_decode:
  false, remote_block_ids, remote_engine_id, remote_host, remote_port, tp_size}``; the blocks are
  freed once the decode side has read them, or after ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``
  (``vllm/envs.py``, default 480 s). Here the answer also names ``remote_request_id`` (which
  request's blocks to pull; vLLM's NIXL side channel knows it from the request id).
- A decode request carries those params verbatim. ``get_num_new_matched_tokens`` loads
  ``len(prompt) - num_computed_tokens``: only what the decode engine's own prefix cache lacks is
  pulled. Those tokens count as the connector's (external) hits, so the prompt is reported
  cached (``usage.prompt_tokens_details.cached_tokens``).

The pull is a POST to ``remote_host:remote_port`` (the prefill engine's own HTTP port stands in
for NIXL's side channel), timed on a link priced like the DDR pool's (``--ddr-gbps`` per device,
20 GB/s, plus ``--transfer-fixed-ms``; sources in docs/benchmarks.md "The fleet and the DDR
pool"). A pull that fails (the blocks expired, the prefill engine is gone) leaves the prompt to
be computed here, as vLLM's ``kv_load_failure_policy: recompute`` does.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from emulator.clock import EmulatedClock
from emulator.engine_model import EngineModel
from emulator.prefix_cache import Hold
from kvgate.contract.states import Role

log = structlog.get_logger("emulator.pd")

ABORT_REQUEST_TIMEOUT_S = 480.0  # vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default (vllm/envs.py)
PULL_PATH = "/kv_transfer/pull"  # the prefill engine's stand-in for NIXL's side channel
_PULL_TIMEOUT_S = 30.0


def remote_decode(params: Any) -> bool:
    """A prefill request (the first stage)."""
    return isinstance(params, Mapping) and bool(params.get("do_remote_decode"))


def remote_prefill(params: Any) -> bool:
    """A decode request carrying a prefill engine's answer (the second stage)."""
    return (isinstance(params, Mapping) and bool(params.get("do_remote_prefill"))
            and bool(params.get("remote_block_ids"))
            and all(params.get(k) is not None for k in ("remote_host", "remote_port")))


@dataclass(slots=True)
class _Held:
    hashes: list[int]
    hold: Hold
    expires: float  # emulated seconds


class Handoffs:
    """The blocks a prefill engine keeps for decode engines, by request, until pulled or
    expired (``timeout_s`` emulated seconds)."""

    def __init__(self, model: EngineModel, clock: EmulatedClock,
                 timeout_s: float = ABORT_REQUEST_TIMEOUT_S) -> None:
        self._model = model
        self._clock = clock
        self.timeout_s = timeout_s
        self._held: dict[str, _Held] = {}
        self._expiry: list[tuple[float, str]] = []
        self._ids = itertools.count(1)
        self.pulled = 0  # requests whose blocks a decode engine pulled
        self.expired = 0  # ... that nobody pulled in time

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, hashes: list[int]) -> str:
        """Pin ``hashes`` (the prompt's full blocks) for a pull; the request id to pull them."""
        self.expire()
        rid = f"prefill-{next(self._ids)}"
        expires = self._clock.now() + self.timeout_s
        self._held[rid] = _Held(hashes, self._model.cache.acquire(hashes), expires)
        heapq.heappush(self._expiry, (expires, rid))
        return rid

    def pull(self, rid: str) -> int | None:
        """A decode engine reads request ``rid``'s blocks: they are unpinned; None when they
        are gone (expired, never held)."""
        self.expire()
        held = self._held.pop(rid, None)
        if held is None:
            return None
        self._model.cache.release(held.hashes, 0, held.hold)
        self.pulled += 1
        return len(held.hashes)

    def expire(self) -> None:
        now = self._clock.now()
        while self._expiry and self._expiry[0][0] <= now:
            _, rid = heapq.heappop(self._expiry)
            held = self._held.pop(rid, None)
            if held is not None:
                self._model.cache.release(held.hashes, 0, held.hold)
                self.expired += 1
                log.info("kv_transfer_expired", request=rid)


@dataclass(frozen=True, slots=True)
class Link:
    """The decode engine's link from a prefill engine, priced like a DDR pool link."""

    gbps: float = 20.0
    fixed_ms: float = 3.0
    kv_bytes_per_token: int = 256 * 1024

    def seconds(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.fixed_ms / 1000.0 + tokens * self.kv_bytes_per_token / (self.gbps * 1e9)


class PdSide:
    """One engine's part in the two-stage wire: its role, the blocks it holds for decode
    engines (any engine may prefill for another, as vLLM's kv_both engines do) and its pulls."""

    def __init__(self, role: Role, model: EngineModel, clock: EmulatedClock, link: Link,
                 timeout_s: float = ABORT_REQUEST_TIMEOUT_S) -> None:
        self.role = role
        self.handoffs = Handoffs(model, clock, timeout_s)
        self._clock = clock
        self._link = link
        self._session: aiohttp.ClientSession | None = None
        self.pulled_tokens = 0
        self.failed_pulls = 0
        self.engine_id = ""  # set once the engine listens (emulator.server)
        self.host = ""
        self.port = 0

    def prefill_answer(self, hashes: list[int]) -> dict[str, Any]:
        """A prefill's ``kv_transfer_params`` (NixlConnectorScheduler.request_finished): its
        blocks are held for a decode engine's pull."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(range(len(hashes))),
            "remote_engine_id": self.engine_id,
            "remote_request_id": self.handoffs.hold(hashes),
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
        }

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def pull(self, params: Mapping[str, Any], lacking_blocks: int, block_size: int,
                   engine_id: str) -> int:
        """Read the prompt's blocks this engine lacks from the prefill engine ``params`` name:
        the blocks now here (0 when the pull failed: the prompt is computed here)."""
        rid = params.get("remote_request_id")
        url = f"http://{_host(params['remote_host'])}:{int(params['remote_port'])}{PULL_PATH}"
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=_PULL_TIMEOUT_S))
        try:
            async with self._session.post(url, json={"remote_request_id": rid}) as reply:
                held = (await reply.json())["blocks"] if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            log.warning("kv_transfer_failed", engine_id=engine_id, url=url, error=str(exc))
            held = None
        if held is None:
            self.failed_pulls += 1
            log.warning("kv_transfer_refused", engine_id=engine_id, request=rid,
                        reason="blocks gone (expired or never held): computing the prompt here")
            return 0
        blocks = max(0, min(lacking_blocks, int(held)))
        # The read itself: only what this engine lacks crosses the link.
        await self._clock.sleep_until(self._clock.now() + self._link.seconds(blocks * block_size))
        self.pulled_tokens += blocks * block_size
        return blocks


def _host(host: Any) -> str:
    text = str(host)
    return f"[{text}]" if ":" in text and not text.startswith("[") else text
