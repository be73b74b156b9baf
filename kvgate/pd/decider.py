"""Per turn of a prefill/decode pool: prefill on a prefill engine, or on the decode engine?

The decode engine comes first: it is the session's binding, chosen by the pipeline under the
load gate, since it holds the conversation (answers included). Then the turn is prefilled
elsewhere only when the tokens that engine lacks reach `disaggregation.skip_prefill_below`,
the shape of llm-d's `prefix-based-pd-decider` (`nonCachedTokens`, on the chosen decode pod)
and Dynamo's conditional disaggregation (`isl_bounding`: the prompt minus the decode worker's
overlap). What the engine lacks comes from its KV events (the gate's HBM residency) when known,
else from the binding: the session's previous turn on the same engine is assumed still there.
The KV events count whole blocks of real tokens and the prompt is estimated from the body's
size, so what they hold is put in the estimate's units first, by the prompt's own ratio
(`held_prompt`); compared raw, agentic-coding 8:8 read 0 tokens lacking for 87 % of its turns
under the threshold (docs/journal/pd.md).
Otherwise the prefill engine whose queue ends soonest takes it, round robin on ties: the pool's
prefill engines all read the same DDR pool, so none holds the session's prefix better than
another. Its queue is the larger of the gate's backlog estimate and this replica's own prefills
in flight there, priced in seconds by the gate's cost model (`EngineCost.prefill_s`), not
counted: one long prompt in flight is seconds of work. Each is priced at its whole prompt, as
vLLM-Ascend's proxy scores a prefill engine by the prompt tokens it has in flight: the prefill
engine reads from the DDR pool or computes every token of it (and the pool never holds the
previous answer), and the decider knows neither its HBM nor the pool. Priced at the decode
engine's lacking tokens instead, a continuing turn looks nearly free and agentic-coding's TTFT
p99 got worse (8:8, 960 sessions, every turn remote: 8.97 s against 7.74 s at the prompt; see
docs/sessions-and-placement.md, "P/D"). The larger, not the sum: the backlog estimate
(kvgate.placement.live.LoadBoard) already counts those prefills when a scrape saw them waiting,
and takes the larger of its ledger and its observations for the same reason.

With `disaggregation.skip_rule: streams` a turn under the threshold still goes to a prefill
engine when prefilling it on the decode engine costs that engine's running streams more seconds
than disaggregating costs the turn (`SkipPrice`, where each term's source is given).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from kvgate.config.sections.disaggregation import SkipRule
from kvgate.pd.skip_price import SkipPrice
from kvgate.placement.cost import EngineCost
from kvgate.placement.signals import HbmTokens, held_prompt
from kvgate.placement.view import Member

# Sessions whose previous turn is remembered (per replica); older ones count as new.
MAX_SESSIONS = 100_000


class Path(StrEnum):
    """How a turn of a P/D pool was prefilled (`kvgate_ext_proc_pd_turns_total{path}`)."""

    REMOTE = "remote"  # on a prefill engine; the decode engine pulled its KV
    CACHED = "skipped_cached"  # the decode engine lacked fewer tokens than the threshold
    NO_PREFILL_ENGINE = "skipped_no_prefill_engine"  # none active in the pool
    SESSIONLESS = "skipped_unplaced"  # no decode engine was chosen (Envoy's ring places it)
    FAILED = "prefill_failed"  # the prefill engine failed or refused: the decode engine did it


@dataclass(frozen=True, slots=True)
class Plan:
    path: Path
    prefill: str | None  # the prefill engine's ip:port when path is REMOTE
    lacking_tokens: int  # what the decode engine was estimated to lack
    source: str  # where that estimate came from: kv_events | binding | new


Running = Callable[[str], int | None]  # engine -> its running requests (its report), if known


@dataclass(slots=True)
class _Turn:
    """A session's previous turn, as this replica routed it."""

    decode: str
    prompt: int
    pooled: int  # the prompt of its last remote turn: what a prefill engine wrote to the pool


class Prefillers(Protocol):
    """A pool's active prefill engines (ext_proc's EndpointDirectory; the simulator's fleet)."""

    def prefillers(self, pool: str) -> tuple[Member, ...]: ...


class PrefillDecider:
    def __init__(self, directory: Prefillers, skip_below: int, *,
                 hbm_tokens: HbmTokens | None = None,
                 backlog_s: Callable[[str], float] | None = None,
                 cost: EngineCost | None = None, rule: SkipRule = SkipRule.THRESHOLD,
                 running: Running | None = None, block_tokens: int | None = None) -> None:
        """`block_tokens`: the size of the prompt blocks `plan` is given (`held_prompt`)."""
        self._directory = directory
        self.skip_below = skip_below
        self._hbm_tokens = hbm_tokens
        self._block_tokens = block_tokens
        self._backlog_s = backlog_s
        self._turns: OrderedDict[str, _Turn] = OrderedDict()  # session -> its last turn
        self._cost = cost or EngineCost()
        self.rule = rule
        self._running = running
        self._price = SkipPrice(self._cost)
        # prefill engine -> the prompt tokens of each of this replica's prefills in flight there
        self._inflight: dict[str, list[int]] = {}
        self._ties = itertools.count()

    def plan(self, pool: str, decode: str | None, session: str | None,
             prompt_tokens: int, blocks: int = 0) -> Plan:
        """`blocks`: the prompt's full blocks, where known (0: not known)."""
        if decode is None:
            return Plan(Path.SESSIONLESS, None, prompt_tokens, "new")
        lacking, source = self._lacking(decode, session, prompt_tokens, blocks)
        last = None if session is None else self._turns.get(session)
        pooled = 0 if last is None else last.pooled
        plan = self._decide(pool, decode, lacking, source, prompt_tokens, pooled)
        if session is not None:
            remote = plan.path is Path.REMOTE
            self._remember(session, _Turn(decode, prompt_tokens,
                                          prompt_tokens if remote else pooled))
        return plan

    def _decide(self, pool: str, decode: str, lacking: int, source: str, prompt: int,
                pooled: int) -> Plan:
        if lacking < self.skip_below:
            running = (None if self.rule is SkipRule.THRESHOLD or self._running is None
                       else self._running(decode))
            if running is None or running <= 0:
                return Plan(Path.CACHED, None, lacking, source)
            picked = self._pick(pool)
            if picked is None or not self._price.streams_pay(
                    running, lacking, prompt, pooled, picked[1]):
                return Plan(Path.CACHED, None, lacking, source)
            return Plan(Path.REMOTE, picked[0], lacking, source)
        picked = self._pick(pool)
        if picked is None:
            return Plan(Path.NO_PREFILL_ENGINE, None, lacking, source)
        return Plan(Path.REMOTE, picked[0], lacking, source)

    def _lacking(self, decode: str, session: str | None, prompt: int,
                 blocks: int) -> tuple[int, str]:
        """What the decode engine lacks of the prompt, and where that came from."""
        if session is None:
            return prompt, "new"
        hbm = self._hbm_tokens
        held = None if hbm is None else held_prompt(
            hbm, decode, session, prompt, blocks, self._block_tokens)
        last = self._turns.get(session)
        if self.rule is SkipRule.STREAMS and last is not None and last.decode == decode:
            return self._grown(prompt, last, held), "binding"
        if held is not None:
            return max(0, prompt - held), "kv_events"
        if last is not None and last.decode == decode:
            return max(0, prompt - last.prompt), "binding"
        return prompt, "new"

    @staticmethod
    def _grown(prompt: int, last: _Turn, held: int | None) -> int:
        """`streams`: the larger of what the prompt grew by since the session's last turn here
        (both sizes estimated alike) and the prompt less what the engine's KV events say it
        holds (what it evicted; `held`, in the estimate's units). The first alone misses
        evictions: bank-coding 8:8 skipped turns its decode engine had evicted (TTFT p99 13.0 s,
        ITL p99 444 ms; docs/journal/pd.md). The second was the rule's first try, when it
        compared the two units raw (it read 0 lacking for 87 % of agentic-coding's short
        turns)."""
        grown = max(0, prompt - last.prompt)
        return grown if held is None else max(grown, prompt - held)

    def _remember(self, session: str, turn: _Turn) -> None:
        self._turns[session] = turn
        self._turns.move_to_end(session)
        if len(self._turns) > MAX_SESSIONS:
            self._turns.popitem(last=False)

    def _pick(self, pool: str) -> tuple[str, float] | None:
        """The prefill engine whose queue ends soonest, and that queue in seconds."""
        engines = self._directory.prefillers(pool)
        if not engines:
            return None
        backlog = self._backlog_s
        tie = next(self._ties)

        def cost(i: int) -> tuple[float, int]:
            address = engines[i].address
            queued = 0.0 if backlog is None else backlog(address)
            return max(queued, self.inflight_s(address)), (i - tie) % len(engines)

        best = min(range(len(engines)), key=cost)
        return engines[best].address, cost(best)[0]

    def inflight_s(self, prefill: str) -> float:
        """Seconds of prefill this replica has in flight on `prefill`, as the gate prices one."""
        price = self._cost.prefill_s
        return sum(price(tokens, tokens) for tokens in self._inflight.get(prefill, ()))

    def started(self, prefill: str, prompt_tokens: int) -> None:
        """A prefill of a `prompt_tokens` prompt was sent to `prefill`."""
        self._inflight.setdefault(prefill, []).append(prompt_tokens)

    def ended(self, prefill: str, prompt_tokens: int) -> None:
        """The prefill `started` with the same `prompt_tokens` answered or failed."""
        inflight = self._inflight.get(prefill)
        if inflight is None or prompt_tokens not in inflight:
            return
        inflight.remove(prompt_tokens)
        if not inflight:
            del self._inflight[prefill]
