"""`disaggregation:` how turns of prefill/decode pools (endpoints with `role`) are split."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvgate.config.schema import Choice, Duration, Integer, key

# Below this many tokens the session's decode engine lacks, the turn is prefilled there.
# Dynamo's conditional disaggregation skips remote prefill under 2,048 effective input tokens
# (DEP #11514, PR #11723, `isl_bounding`); llm-d's prefix-based-pd-decider has the same shape
# (`nonCachedTokens`). At the emulator's 5,000 tok/s, 2,048 tokens prefill in ~0.4 s on the
# decode engine itself, which a remote prefill (a hop, a second queue, a KV read) does not beat.
DEFAULT_SKIP_PREFILL_BELOW = 2048


class SkipRule(StrEnum):
    """`disaggregation.skip_rule`: what keeps a turn under the threshold on its decode engine."""

    THRESHOLD = "threshold"  # the threshold alone
    STREAMS = "streams"  # and its prefill costs the decode engine's streams less (SkipPrice)


@dataclass(frozen=True, slots=True)
class Disaggregation:
    skip_prefill_below: int = key(
        Integer(0, 100_000_000), "a turn goes to a prefill engine only when the tokens its "
        "decode engine lacks (from its KV events, else the session's previous turn) reach "
        "this; below it the decode engine prefills the turn itself. 0: every turn",
        default=DEFAULT_SKIP_PREFILL_BELOW)
    skip_rule: str = key(
        Choice(tuple(SkipRule)), "what keeps a turn under `skip_prefill_below` on its decode "
        "engine: `threshold` (the threshold alone) or `streams` (also that its prefill, riding "
        "the decode engine's steps, costs the engine's running streams fewer seconds than the "
        "prefill engine's queue and the KV transfers cost the turn; kvgate/pd/skip_price.py). "
        "`streams` needs the engines' reports (their running requests)",
        default=SkipRule.THRESHOLD.value)
    prefill_timeout: float = key(
        Duration(0.1, 3600.0), "a prefill engine's deadline for its answer; past it (or on "
        "any error) the decode engine prefills the turn, and the request does not fail",
        default=30.0)
