"""How well a request's Content-Length estimates its prompt tokens (the load gate's size input).

    python bench/prompt_size.py [--sessions 400] [--duration-s 1800]

For every request of the default bank-coding workload, the body `kvgate bench` sends
(/v1/completions JSON) against the prompt's tokens under the emulator's tokenizer; then the same
for chat requests an OpenAI client would send about this repository's own source files (code in
JSON strings: newlines and quotes escaped). Prints bytes per token and the error of the estimate
at `placement.load_gate.bytes_per_token` (default 4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emulator.tokenize import Tokenizer, render_chat
from workload.bank import BankCodingOptions, bank_coding
from workload.text import TextMaker

ROOT = Path(__file__).resolve().parents[1]


def _summary(name: str, pairs: list[tuple[int, int]], per_token: float) -> str:
    ratios = sorted(b / t for b, t in pairs if t)
    errors = sorted((b / per_token - t) / t for b, t in pairs if t)

    def pct(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return (f"{name}: {len(ratios)} requests; bytes/token mean {statistics.fmean(ratios):.2f}, "
            f"p10 {pct(ratios, 0.1):.2f}, p90 {pct(ratios, 0.9):.2f}; estimate at "
            f"{per_token:g} B/token: median error {pct(errors, 0.5):+.0%}, "
            f"p10 {pct(errors, 0.1):+.0%}, p90 {pct(errors, 0.9):+.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--bytes-per-token", type=float, default=4.0)
    args = parser.parse_args()
    tokenizer = Tokenizer()
    texts = TextMaker()
    workload = bank_coding(BankCodingOptions(sessions=args.sessions, duration_s=args.duration_s))
    bench: list[tuple[int, int]] = []
    for request in workload.requests:
        prompt = texts.prompt(request)
        body = {"model": "Qwen/Qwen2.5-32B-Instruct", "prompt": prompt,
                "max_tokens": request.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        bench.append((len(json.dumps(body).encode()), len(tokenizer.encode(prompt))))
    print(_summary("bench workload (/v1/completions)", bench, args.bytes_per_token))
    chat: list[tuple[int, int]] = []
    for path in sorted(ROOT.glob("*/*.py")):
        messages = [{"role": "system", "content": "You are a coding assistant."},
                    {"role": "user", "content": path.read_text() + "\nExplain this file."}]
        body = {"model": "Qwen/Qwen2.5-32B-Instruct", "messages": messages, "max_tokens": 256}
        chat.append((len(json.dumps(body).encode()),
                     len(tokenizer.encode(render_chat(messages)))))
    print(_summary("chat about this repository's files", chat, args.bytes_per_token))


if __name__ == "__main__":
    main()
