"""Build the tiny test model: run by the vLLM environment's interpreter (needs torch,
transformers, tokenizers), not kvgate's; imports nothing of kvgate.

    python build_model.py --vocab words.txt --out DIR [--seed 0]

A Llama-architecture model (hidden 256, 4 layers, 4 heads, float32) with seeded random weights,
and a WordLevel tokenizer whose vocabulary is the given words: one word, one token, so a bench
prompt of N words is N tokens for vLLM as for the emulator. Words carry a leading-space marker
(Metaspace) and decode back to " word", so an answer streamed by vLLM and sent back inside the
next prompt tokenizes to exactly the tokens vLLM generated (and cached). The only special token is
<unk>, which is also end-of-sequence: a generated one ends the answer instead of vanishing from
its text. The same words, seed and torch version give byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

UNK = "<unk>"
MARK = "\u2581"  # Metaspace's word marker
# A chat turn renders as " role content", role words being in the vocabulary; the content is
# trimmed, so an answer (" w1 w2") sent back renders to exactly the tokens generated.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ ' ' + message['role'] + ' ' + (message['content'] | trim) }}"
    "{% endfor %}{% if add_generation_prompt %}{{ ' assistant' }}{% endif %}"
)
EXTRA_WORDS = ("system", "user", "assistant", "hello", "hi")


def build(words: list[str], out: Path, seed: int, max_positions: int) -> dict[str, object]:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    ordered: list[str] = []
    for word in [*words, *EXTRA_WORDS]:
        if word and word not in ordered:
            ordered.append(word)
    vocab = {UNK: 0, **{MARK + w: i + 1 for i, w in enumerate(ordered)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement=MARK, prepend_scheme="always")
    # "never": every token decodes with its leading space, the first one too.
    core.decoder = decoders.Metaspace(replacement=MARK, prepend_scheme="never")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token=UNK, eos_token=UNK, bos_token=UNK, pad_token=UNK,
        chat_template=CHAT_TEMPLATE, model_max_length=max_positions,
    )
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_positions,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    digest = hashlib.sha256()
    for path in sorted(out.glob("*.safetensors")):
        digest.update(path.read_bytes())
    info = {
        "seed": seed, "vocab_size": len(vocab), "parameters": sum(p.numel() for p in
                                                                  model.parameters()),
        "weights_sha256": digest.hexdigest(), "torch": torch.__version__,
        "max_positions": max_positions,
    }
    (out / "kvgate-model.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=Path, required=True, help="one word per line")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=32768)
    args = parser.parse_args()
    words = [w.strip() for w in args.vocab.read_text().splitlines() if w.strip()]
    print(json.dumps(build(words, args.out, args.seed, args.max_positions)))


if __name__ == "__main__":
    main()
