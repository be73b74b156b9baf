"""Who prefills and who decodes a turn of a prefill/decode fleet: kvgate's policy and the peers',
as their sources define them (``kvgate simulate --pd P:D``).

Each router picks a decode engine and a prefill engine, or none (the decode engine prefills the
turn itself). The simulation tells it when a prefill is done (its KV handed off), when the
decode engine has pulled it, and when a stream ends, at those instants; what it counts from
them is what the peer's proxy counts. ``cached(engine, blocks)`` is what an engine's prefix
cache holds of a prompt (its KV events, exactly), for the peers whose routers use KV events.

- ``pd-kvgate``: the decode engine is the session's binding, placed and moved by kvgate's
  decision pipeline under the load gate (``kvgate.routing.Pipeline``, as ``affinity+ddr``); then
  ``kvgate.pd.decider.PrefillDecider``, the code ext_proc runs: skip the prefill engines when the
  decode engine lacks fewer than ``disaggregation.skip_prefill_below`` tokens (from its KV
  events with ``--hbm-residency on``, else the session's previous turn there), else the prefill
  engine with the shortest queue: the gate's backlog estimate (its load board) or, if larger,
  its prefills in flight from this router priced in seconds (``EngineCost.prefill_s`` of their
  prompts). With ``--skip-rule streams`` a turn under the threshold also needs its prefill to
  cost the decode engine's running streams (from its scraped ``vllm:num_requests_running``)
  fewer seconds than disaggregating costs the turn (``kvgate.pd.skip_price``).
- ``pd-vllm-ascend``: vllm-project/vllm-ascend ``examples/disaggregated_prefill_v1/
  load_balance_proxy_server_example.py``: ``ProxyState._update_prefiller_priority`` (prefill
  engine by the least ``active_tokens + 0.3 x active_kv_cache``), ``_update_decoder_priority``
  (decode engine by the least ``active_tokens``), both charged with the request's score on
  selection (``select_prefiller``, ``select_decoder``); a prefill engine's ``active_tokens`` is
  released when its prefill answers, its ``active_kv_cache`` when the decode engine has the KV,
  the decode engine's at the stream's end. Ties: the lowest index (the heap's ``(priority,
  index)``). Never skips prefill; no sessions. The score here is the prompt's tokens.
- ``pd-llm-d``: llm-d-router ``disagg-profile-handler`` runs the decode profile first; the
  ``prefix-based-pd-decider`` runs the prefill profile only when the tokens the chosen decode pod
  lacks reach ``nonCachedTokens`` (16 here: llm-d-router's P/D example configs; 0 disables P/D).
  Decode profile: session affinity (the pod that served the session's last turn; llm-d-router
  #1551: affinity covers the decoder only), else the longest prefix match, then the fewest
  active requests. Prefill profile: ``prefix-cache-scorer`` + ``token-load-scorer`` (equal
  weights, ``max-score-picker``). Prefix matches from the pods' KV events (the precise scorer).
- ``pd-dynamo``: ai-dynamo/dynamo ``docs/design_docs/disagg_serving.md`` and
  ``docs/components/router/router-disaggregated-serving.md``: the ``PrefillRouter`` picks the
  prefill worker by KV cost (``overlap_score_weight`` 1.0 x blocks to prefill + active blocks),
  the decode worker by load alone (``overlap_score_credit=0``: active decode blocks); conditional
  disaggregation (DEP #11514, PR #11723, ``isl_bounding``) skips the prefill worker when the
  effective prompt (the raw one minus the decode worker's cached overlap, from its KV events) is
  under 2,048 tokens and under 0.7 of the raw one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from kvgate.config.sections.disaggregation import SkipRule
from kvgate.contract.modes import PdMode
from kvgate.contract.states import EndpointState
from kvgate.fleet.prefill_mix import PrefillMix
from kvgate.pd.decider import Path, PrefillDecider
from kvgate.placement.view import Member
from kvgate.routing import build_policy
from simulator.routing import (
    POOL,
    AffinityRouter,
    Ask,
    EngineHoldings,
    Metrics,
    PoolHoldings,
    RouterSetup,
    ScrapedBoard,
)

Cached = Callable[[str, Sequence[int]], int]  # (engine, prompt's blocks) -> tokens it holds

LLM_D_NON_CACHED_TOKENS = 16
DYNAMO_ISL_BOUND = 2048  # isl_bounding: effective prompt under this...
DYNAMO_ISL_RATIO = 0.7  # ... and under this share of the raw prompt
VLLM_ASCEND_KV_WEIGHT = 0.3


class PdPick(NamedTuple):
    decode: str
    prefill: str | None  # None: the decode engine prefills the turn itself


class PdRouter(Protocol):
    async def pick(self, ask: Ask, now: float) -> PdPick | None: ...

    def prefill_done(self, prefill: str, ask: Ask, now: float) -> None:
        """The prefill answered: its KV waits for the decode engine."""

    def pulled(self, prefill: str, ask: Ask, now: float) -> None:
        """The decode engine has the prefill's KV."""

    def decode_done(self, decode: str, ask: Ask, now: float) -> None:
        """The decode engine's stream ended."""


class _Quiet:
    """A router that counts nothing from the simulation's instants; the ``Router`` protocol's
    other calls (engines never fail or drain under ``--pd``)."""

    decode: list[str]

    async def pick(self, ask: Ask, now: float) -> PdPick | None:
        raise NotImplementedError

    async def route(self, ask: Ask, now: float) -> str | None:
        pick = await self.pick(ask, now)
        return None if pick is None else pick.decode

    def set_state(self, address: str, state: EndpointState) -> None:
        pass

    def answered(self, address: str, ask: Ask, first_token: float, finish: float) -> None:
        pass

    def queued(self, address: str, ask: Ask) -> None:
        pass

    def prefill_done(self, prefill: str, ask: Ask, now: float) -> None:
        pass

    def pulled(self, prefill: str, ask: Ask, now: float) -> None:
        pass

    def decode_done(self, decode: str, ask: Ask, now: float) -> None:
        pass


def least(scores: dict[str, float]) -> str:
    """The lowest score; ties to the first engine (the peers' heaps break ties by index)."""
    return min(scores, key=lambda a: scores[a])


class VllmAscendPd(_Quiet):
    """vLLM-Ascend's load-balance proxy (see the module's docstring)."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str]) -> None:
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.active_tokens = dict.fromkeys([*prefill, *decode], 0.0)
        self.active_kv = dict.fromkeys(prefill, 0.0)

    async def pick(self, ask: Ask, now: float) -> PdPick | None:
        score = float(ask.tokens)
        p = least({a: self.active_tokens[a] + VLLM_ASCEND_KV_WEIGHT * self.active_kv[a]
                   for a in self.prefill})
        d = least({a: self.active_tokens[a] for a in self.decode})
        self.active_tokens[p] += score
        self.active_kv[p] += score
        self.active_tokens[d] += score
        return PdPick(d, p)

    def prefill_done(self, prefill: str, ask: Ask, now: float) -> None:
        self.active_tokens[prefill] -= ask.tokens

    def pulled(self, prefill: str, ask: Ask, now: float) -> None:
        self.active_kv[prefill] -= ask.tokens

    def decode_done(self, decode: str, ask: Ask, now: float) -> None:
        self.active_tokens[decode] -= ask.tokens


class LlmdPd(_Quiet):
    """llm-d's P/D scheduling (see the module's docstring)."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str], cached: Cached,
                 non_cached_tokens: int = LLM_D_NON_CACHED_TOKENS) -> None:
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.cached = cached
        self.non_cached_tokens = non_cached_tokens
        self.requests = dict.fromkeys(decode, 0)  # active-request count per decode pod
        self.tokens = dict.fromkeys(prefill, 0.0)  # tokens in flight per prefill pod
        self.last: dict[str, str] = {}  # session -> the decode pod of its last turn

    async def pick(self, ask: Ask, now: float) -> PdPick | None:
        d = self.last.get(ask.session)
        if d is None:
            held = {a: self.cached(a, ask.hashes) for a in self.decode}
            d = min(self.decode, key=lambda a: (-held[a], self.requests[a]))
        self.last[ask.session] = d
        self.requests[d] += 1
        uncached = ask.tokens - self.cached(d, ask.hashes)
        if self.non_cached_tokens <= 0 or uncached < self.non_cached_tokens:
            return PdPick(d, None)
        return PdPick(d, self._prefill(ask))

    def _prefill(self, ask: Ask) -> str:
        total = max(1, ask.tokens)
        busiest = max(self.tokens.values()) or 1.0
        scores = {a: -(min(1.0, self.cached(a, ask.hashes) / total)
                       + 1.0 - self.tokens[a] / busiest) for a in self.prefill}
        p = least(scores)
        self.tokens[p] += ask.tokens
        return p

    def prefill_done(self, prefill: str, ask: Ask, now: float) -> None:
        self.tokens[prefill] -= ask.tokens

    def decode_done(self, decode: str, ask: Ask, now: float) -> None:
        self.requests[decode] -= 1


class DynamoPd(_Quiet):
    """Dynamo's disaggregated router with conditional disaggregation (see the module's
    docstring)."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str], cached: Cached,
                 block_size: int) -> None:
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.cached = cached
        self.block_size = block_size
        self.active = dict.fromkeys([*prefill, *decode], 0.0)  # active blocks per worker

    def _blocks(self, ask: Ask) -> int:
        return math.ceil(ask.tokens / self.block_size)

    async def pick(self, ask: Ask, now: float) -> PdPick | None:
        blocks = self._blocks(ask)
        d = least({a: self.active[a] for a in self.decode})
        self.active[d] += blocks
        effective = ask.tokens - self.cached(d, ask.hashes)
        if effective < DYNAMO_ISL_BOUND and effective < DYNAMO_ISL_RATIO * ask.tokens:
            return PdPick(d, None)
        costs = {a: max(0, blocks - self.cached(a, ask.hashes) // self.block_size)
                 + self.active[a] for a in self.prefill}
        p = least(costs)
        self.active[p] += blocks
        return PdPick(d, p)

    def prefill_done(self, prefill: str, ask: Ask, now: float) -> None:
        self.active[prefill] -= self._blocks(ask)

    def decode_done(self, decode: str, ask: Ask, now: float) -> None:
        self.active[decode] -= self._blocks(ask)


class _Prefillers:
    """The one pool's prefill engines, as ext_proc's EndpointDirectory offers them."""

    def __init__(self, prefill: Sequence[str]) -> None:
        self._members = tuple(Member(a, "ddr-pool") for a in prefill)

    def prefillers(self, pool: str) -> tuple[Member, ...]:
        return self._members


class KvgatePd(_Quiet):
    """kvgate: the decode engine by the session's binding under the load gate, then
    ``PrefillDecider`` (see the module's docstring)."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str],
                 clock: Callable[[], float], load_factor: float, idle_ttl: float,
                 setup: RouterSetup, metrics: Metrics, skip_below: int, skip_rule: SkipRule,
                 holdings: PoolHoldings | None, hbm: EngineHoldings | None) -> None:
        self.decode = list(decode)
        mix = PrefillMix()
        self.board = ScrapedBoard(metrics, mix, setup.max_age_s)
        self._clock = clock
        nodes = {a: str(i // setup.devices_per_node)
                 for i, a in enumerate([*prefill, *decode])}
        policy = build_policy(setup.gate.turned(True), setup.cost, self.board, clock=clock,
                              mix=mix, residency=holdings, hbm=hbm,
                              node_of=lambda address: nodes.get(address, address),
                              prefixes=hbm, block_tokens=setup.block_size)
        # The decode engines reach the pool through the prefill engines: one DDR pool.
        self._decode = AffinityRouter(decode, ["ddr-pool"] * len(decode), clock, load_factor,
                                      idle_ttl, policy, holdings, hbm)
        self.decider = PrefillDecider(
            _Prefillers(prefill), skip_below,
            hbm_tokens=None if hbm is None else hbm.hbm_tokens,
            backlog_s=lambda address: self.board.backlog_s(address, clock()), cost=setup.cost,
            rule=skip_rule, running=self._running, block_tokens=setup.block_size)

    def _running(self, address: str) -> int | None:
        """The engine's running requests as its last scrape reported them (ext_proc's board)."""
        seen = self.board.observed(address, self._clock())
        return None if seen is None else seen.figures.running

    async def pick(self, ask: Ask, now: float) -> PdPick | None:
        decode = await self._decode.route(ask, now)
        if decode is None:
            return None
        plan = self.decider.plan(POOL, decode, ask.session, ask.prompt_tokens, len(ask.hashes))
        if plan.path is not Path.REMOTE or plan.prefill is None:
            return PdPick(decode, None)
        self.decider.started(plan.prefill, ask.prompt_tokens)
        return PdPick(decode, plan.prefill)

    def prefill_done(self, prefill: str, ask: Ask, now: float) -> None:
        self.decider.ended(prefill, ask.prompt_tokens)


def make_pd_router(mode: PdMode, prefill: Sequence[str], decode: Sequence[str], *,
                   clock: Callable[[], float], load_factor: float, idle_ttl: float,
                   setup: RouterSetup, metrics: Metrics, skip_below: int, cached: Cached,
                   holdings: PoolHoldings | None, hbm: EngineHoldings | None,
                   skip_rule: SkipRule = SkipRule.THRESHOLD) -> _Quiet:
    if mode is PdMode.KVGATE:
        return KvgatePd(prefill, decode, clock, load_factor, idle_ttl, setup, metrics,
                        skip_below, skip_rule, holdings, hbm)
    if mode is PdMode.VLLM_ASCEND:
        return VllmAscendPd(prefill, decode)
    if mode is PdMode.LLM_D:
        return LlmdPd(prefill, decode, cached)
    return DynamoPd(prefill, decode, cached, setup.block_size)
