"""A request body's prompt as chained block hashes, without a tokenizer: the keys the prefix
step's index (kvgate.placement.prefix.RoutedPrefixes) records and looks up live.

The Gateway API Inference Extension's prefix-cache scorer does the same
(kubernetes-sigs/gateway-api-inference-extension, pkg/epp/scheduling/framework/plugins/multi/
prefix/plugin.go, `hashPrompt` and `getUserInputBytes`): the prompt's text (the chat messages,
or the completion's prompt) is cut into blocks of `blockSizeTokens` × 4 bytes (its
`averageCharactersPerToken`), at most `maxPrefixBlocksToMatch` (256) of them, a trailing partial
block dropped; the chain starts from xxHash64 of the model name (and the request's
`cache_salt`), and block i's hash is xxHash64 of its bytes followed by block i-1's hash
(8 bytes, little-endian). Two requests whose text starts alike get the same leading keys, so a
template shared across sessions is found, whatever comes after it.

llm-d's precise scorer tokenizes instead (llm-d-kv-cache-manager, pkg/kvcache/kvblock/
token_processor.go, `ChunkedTokenDatabase.TokensToKVBlockKeys`: the model's tokenizer, then
vLLM's own block hashes, matched against the engines' KV events). That needs the served model's
tokenizer in the gateway and is exact; character blocks need nothing and are what the index
here needs: keys that repeat when the prompt's start repeats. Their token count is an estimate
(`block_tokens`), as the index's holdings are.

Unlike the scorer, the text hashed is each message's role and content (text parts joined), not
the messages' JSON: a client that orders a message's keys differently, or escapes differently,
sends the same prompt. A token counts as `placement.load_gate.bytes_per_token` bytes (4 by
default, the scorer's figure), the ratio the gate already sizes prompts with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xxhash

# The scorer's `averageCharactersPerToken`, and the default of kvgate's own estimate of a prompt's
# tokens from its size (`placement.load_gate.bytes_per_token`), which ext_proc passes.
CHARS_PER_TOKEN = 4.0
# The scorer's `maxPrefixBlocksToMatch`; also RoutedPrefixes' `leading_blocks`.
MAX_BLOCKS = 256


class PromptBlocks:
    """Chained hashes of a prompt's leading `block_tokens`-token blocks (`block_tokens` ×
    `chars_per_token` bytes of its UTF-8 text each), at most `max_blocks`."""

    __slots__ = ("block_chars", "block_tokens", "max_blocks")

    def __init__(self, block_tokens: int, chars_per_token: float = CHARS_PER_TOKEN,
                 max_blocks: int = MAX_BLOCKS) -> None:
        if block_tokens < 1 or max_blocks < 1 or chars_per_token <= 0:
            raise ValueError(f"prompt blocks: block_tokens ({block_tokens}), max_blocks "
                             f"({max_blocks}) and chars_per_token ({chars_per_token}) must be "
                             "positive")
        self.block_tokens = block_tokens
        self.block_chars = max(1, round(block_tokens * chars_per_token))
        self.max_blocks = max_blocks

    def of_body(self, body: bytes) -> list[int]:
        """The blocks of an OpenAI request body's prompt (`/v1/chat/completions`,
        `/v1/completions`); none when the body is not such a request or its prompt is shorter
        than one block (it is then placed as without the prefix step)."""
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return []
        if not isinstance(request, dict):
            return []
        text = prompt_text(request)
        if not text:
            return []
        return self.of_text(text, _root(request))

    def full(self, request: Mapping[str, Any]) -> int:
        """How many whole blocks a parsed request's prompt fills, not capped at `max_blocks`
        and not hashed: the P/D decider's `blocks` (kvgate.placement.signals.held_prompt)."""
        return len(prompt_text(request).encode()) // self.block_chars

    def of_text(self, text: str, root: int = 0) -> list[int]:
        """The blocks of `text`, chained from `root`."""
        width = self.block_chars
        raw = text.encode()[:width * self.max_blocks]
        hashes: list[int] = []
        parent = root
        for start in range(0, len(raw) - width + 1, width):
            parent = xxhash.xxh64_intdigest(raw[start:start + width]
                                            + parent.to_bytes(8, "little"))
            hashes.append(parent)
        return hashes


def prompt_text(request: Mapping[str, Any]) -> str:
    """The prompt's text: each chat message's role and content (its text parts joined), or a
    completion's prompt (a string, or the first of a list); "" if neither."""
    messages = request.get("messages")
    if isinstance(messages, list):
        return "".join(_message(m) for m in messages if isinstance(m, dict))
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ""


def _message(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content
                          if isinstance(part, dict) and isinstance(part.get("text"), str))
    role = message.get("role")
    # Separators no JSON string decodes to by accident: a role's text cannot run into its content.
    return f"\x1e{role if isinstance(role, str) else ''}\x1f" + (
        content if isinstance(content, str) else "")


def _root(request: Mapping[str, Any]) -> int:
    """The chain's start: the model's name and the request's `cache_salt` (vLLM's: requests with
    different salts share no cache), so different models or salts share no block."""
    model, salt = request.get("model"), request.get("cache_salt")
    seed = (model if isinstance(model, str) else "") + (salt if isinstance(salt, str) else "")
    return xxhash.xxh64_intdigest(seed.encode())
