"""The prompt size a router can know before sending a request.

ext_proc sees headers only: it estimates a prompt's tokens from the request's `content-length`
(bytes ÷ bytes per token). How many bytes a token takes depends on the content (code, prose,
another script, JSON escapes): it is steady within a conversation, whose context is mostly the
same text turn after turn, and varies between conversations. So the estimate is the true count
times a per-session factor (lognormal, `sigma`) and a small per-request one (`sigma` / 4);
`sigma` 0 gives the exact count, which no header-only router has.
"""

from __future__ import annotations

import math
import random

import xxhash


class PromptEstimate:
    """Estimated prompt tokens, deterministic per (session, request) for a given seed."""

    def __init__(self, sigma: float = 0.25, seed: int = 0) -> None:
        if not sigma >= 0:
            raise ValueError(f"prompt estimate error must be >= 0, got {sigma:g}")
        self.sigma = sigma
        self._seed = seed
        self._session_factor: dict[str, float] = {}

    def tokens(self, session: str, true_tokens: int) -> int:
        if self.sigma == 0:
            return true_tokens
        factor = self._session_factor.get(session)
        if factor is None:
            # Seeded by the session, so every mode sees the same error for the same session.
            rng = random.Random(xxhash.xxh64_intdigest(session.encode(), self._seed))
            factor = math.exp(rng.gauss(0.0, self.sigma))
            self._session_factor[session] = factor
        # The same request gets the same error in every mode (their send orders differ).
        key = xxhash.xxh64_intdigest(f"{session}/{true_tokens}".encode(), self._seed)
        noise = math.exp(random.Random(key).gauss(0.0, self.sigma / 4))
        return max(1, round(true_tokens * factor * noise))
