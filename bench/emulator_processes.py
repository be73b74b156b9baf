"""How much the emulator's own CPU adds to TTFT, with its instances in one process or several.

    python bench/emulator_processes.py [--instances 4] [--processes 1,2] [--rate 60]
                                       [--seconds 20] [--prompt-words 3000] [--time-scale 1/20]

For each process count: ``python -m emulator`` with that many ``--processes``, then open-loop
streaming completions at ``--rate`` requests/s (Poisson arrivals, spread over the instances in
turn), every prompt new (no cache hit: the model's TTFT is c0 + prompt ÷ prefill rate). TTFT is
measured by the client (send to first streamed token) in emulated seconds, beside the TTFT the
emulator's model charged (``vllm:time_to_first_token_seconds``, its sum ÷ count over the run): the
difference is what the emulator's own work (HTTP, JSON, tokenizing, hashing, and waiting for a
busy event loop) adds. The client runs on the same machine and costs CPU too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: `emulator` is imported from the tree

from emulator.command import time_scale  # noqa: E402
from kvgate.contract import vllm  # noqa: E402
from workload.text import vocabulary  # noqa: E402


def start(instances: int, processes: int, scale: float, ready: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulator", "--instances", str(instances), "--processes",
         str(processes), "--time-scale", repr(scale), "--no-ddr-pool", "--log-level", "warning",
         "--ready-file", str(ready)], cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the emulator did not start")
        time.sleep(0.05)
    return proc


_TTFT_SUM = f"{vllm.TIME_TO_FIRST_TOKEN_SECONDS}_sum"
_TTFT_COUNT = f"{vllm.TIME_TO_FIRST_TOKEN_SECONDS}_count"


async def model_ttft(http: aiohttp.ClientSession, engines: list[str]) -> tuple[float, float]:
    """(sum, count) of the engines' TTFT histograms."""
    total = count = 0.0
    for engine in engines:
        async with http.get(f"http://{engine}/metrics") as reply:
            sums = vllm.read_samples(await reply.text(), (_TTFT_SUM, _TTFT_COUNT))
            total += sums.get(_TTFT_SUM, 0.0)
            count += sums.get(_TTFT_COUNT, 0.0)
    return total, count


async def drive(engines: list[str], args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(0)
    words = vocabulary()
    ttfts: list[float] = []
    errors = 0

    async def one(http: aiohttp.ClientSession, engine: str, prompt: str) -> None:
        nonlocal errors
        body = {"prompt": prompt, "max_tokens": 4, "stream": True}
        sent = time.perf_counter()
        try:
            async with http.post(f"http://{engine}/v1/completions", json=body) as reply:
                async for line in reply.content:
                    if line.startswith(b"data: "):
                        ttfts.append((time.perf_counter() - sent) / args.time_scale)
                        break
                await reply.read()
        except aiohttp.ClientError:
            errors += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        before = await model_ttft(http, engines)
        tasks = []
        start = time.perf_counter()
        due = start
        n = 0
        while due < start + args.seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            prompt = f"request {n}:" + "".join(rng.choices(words, k=args.prompt_words))
            tasks.append(asyncio.create_task(one(http, engines[n % len(engines)], prompt)))
            n += 1
            due += rng.expovariate(args.rate)
        await asyncio.gather(*tasks)
        after = await model_ttft(http, engines)
    charged = (after[0] - before[0]) / max(after[1] - before[1], 1)
    ttfts.sort()
    return {"requests": n, "errors": errors, "client_p50": statistics.median(ttfts),
            "client_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "client_mean": statistics.fmean(ttfts), "model_mean": charged}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--processes", default="1,2", help="process counts to compare")
    parser.add_argument("--rate", type=float, default=60.0, help="requests per wall second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--prompt-words", type=int, default=3000)
    parser.add_argument("--time-scale", type=time_scale, default=1 / 20)
    args = parser.parse_args()
    print(f"{args.instances} instances, {args.rate:g} req/s for {args.seconds:g} s, "
          f"~{args.prompt_words} words a prompt, time scale {args.time_scale:g}; TTFT in "
          f"emulated seconds")
    print("processes  requests  errors  client p50  client p99  client mean  model mean  added")
    for processes in (int(p) for p in args.processes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            ready = Path(tmp) / "ready.json"
            proc = start(args.instances, processes, args.time_scale, ready)
            try:
                engines = json.loads(ready.read_text())["engines"]
                r = asyncio.run(drive(engines, args))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        print(f"{processes:>9}  {r['requests']:>8.0f}  {r['errors']:>6.0f}  "
              f"{r['client_p50']:>10.3f}  {r['client_p99']:>10.3f}  {r['client_mean']:>11.3f}  "
              f"{r['model_mean']:>10.3f}  {r['client_mean'] - r['model_mean']:>5.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
