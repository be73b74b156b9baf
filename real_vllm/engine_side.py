"""What the engines themselves measured of a run: vLLM's per-request histograms (their sums and
counts, read from every engine's /metrics before and after) as means, so a calibration can split
a request's time to first token into the engine's queueing, its prefill, and what is spent
outside the engine (the API server, the gateway): what no timing model charges today
(docs/journal/real-vllm-calibration.md, "The quiet-core run")."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from kvgate.contract import vllm

# vLLM 0.32's histograms (vllm/v1/metrics/loggers.py), in seconds.
HISTOGRAMS = {
    "queue_s": "vllm:request_queue_time_seconds",
    "prefill_s": "vllm:request_prefill_time_seconds",
    "ttft_s": "vllm:time_to_first_token_seconds",
}
_SAMPLES = [f"{name}_{part}" for name in HISTOGRAMS.values() for part in ("sum", "count")]

Totals = dict[str, float]


def totals_of(pages: Sequence[str]) -> Totals:
    """Each histogram's sum and count over the engines' pages."""
    out: Totals = {}
    for page in pages:
        for name, value in vllm.read_samples(page, _SAMPLES).items():
            out[name] = out.get(name, 0.0) + value
    return out


def means(before: Totals, after: Totals) -> dict[str, float | None]:
    """Each histogram's mean over the requests between the two readings (None: none)."""
    out: dict[str, float | None] = {}
    for key, name in HISTOGRAMS.items():
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        out[key] = round(total / count, 6) if count > 0 else None
    out["requests"] = after.get(f"{HISTOGRAMS['ttft_s']}_count", 0.0) - before.get(
        f"{HISTOGRAMS['ttft_s']}_count", 0.0)
    return out


async def read_totals(urls: Sequence[str]) -> Totals:
    """The engines' histograms now (their whole /metrics pages)."""
    pages = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for url in urls:
            async with http.get(f"{url}/metrics") as reply:
                reply.raise_for_status()
                pages.append(await reply.text())
    return totals_of(pages)
