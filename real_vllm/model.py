"""The tiny test model, built once per vocabulary, seed and vLLM environment, then reused."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from real_vllm.install import VllmEnv
from workload.text import vocabulary

BUILDER = Path(__file__).with_name("build_model.py")
SEED = 0


def bench_words() -> list[str]:
    """The words of every bench prompt, without their leading space."""
    return [w.strip() for w in vocabulary()]


def ensure_model(env: VllmEnv, cache: Path, seed: int = SEED) -> Path:
    """The model's directory, built by the vLLM environment's interpreter if not there yet.

    Its name carries a digest of what determines it (words, seed, builder code), so a change
    to any of them builds a new one instead of reusing a stale one."""
    words = bench_words()
    digest = hashlib.sha256(json.dumps([words, seed]).encode() + BUILDER.read_bytes())
    out = cache / f"model-{digest.hexdigest()[:12]}"
    if (out / "kvgate-model.json").exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    vocab = cache / "bench-words.txt"
    vocab.write_text("\n".join(words) + "\n")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted build
    done = subprocess.run(
        [str(env.python), str(BUILDER), "--vocab", str(vocab), "--out", str(partial),
         "--seed", str(seed)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{done.stderr[-3000:]}")
    partial.rename(out)  # whole or absent: an interrupted build is never reused
    return out


def model_info(model: Path) -> dict[str, object]:
    return dict(json.loads((model / "kvgate-model.json").read_text()))


def kv_bytes_per_token(model: Path) -> int:
    """Bytes of KV cache one token takes (keys and values, every layer, float32)."""
    config = json.loads((model / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(2 * config["num_hidden_layers"] * heads * head_dim * 4)
