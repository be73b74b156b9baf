"""OpenAI / vLLM request parsing and response shapes (pure: dicts in, dicts and bytes out)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import xxhash

from emulator.tokenize import render_chat

Kind = Literal["chat", "completion"]
DEFAULT_MAX_TOKENS = 16
MAX_MAX_TOKENS = 1_000_000

# Filler vocabulary for generated text: each output token is one of these pieces, each a single
# token for the tokenizer (at most six letters), so a client that sends the answer back in its
# next prompt sends exactly the tokens the engine generated (and cached).
_WORDS: tuple[str, ...] = tuple(
    " " + w
    for w in (
        "the of and to in is that for it as with was on be by this are from at or an not but "
        "code data return value list func type self def class import if else while node key map "
        "cache block token reply user engine route pool hash load time fast slow"
    ).split()
)


class ApiError(Exception):
    """A request the API rejects; becomes an OpenAI-shaped error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
                503: "ServiceUnavailableError"}  # fmt: skip


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI-shaped error JSON (what the openai client parses into ``APIStatusError``)."""
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What the emulator needs from a completion request."""

    kind: Kind
    model: str
    prompt_text: str | None  # rendered prompt, or None when token ids were given
    prompt_ids: list[int] | None
    max_tokens: int | None  # None: not given (the engine decides: emulator.context_length)
    stream: bool
    include_usage: bool


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens")
    param = "max_completion_tokens"
    if value is None:
        value, param = body.get("max_tokens"), "max_tokens"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MAX_TOKENS:
        raise ApiError(f"'{param}' must be an integer between 1 and {MAX_MAX_TOKENS}", param=param)
    return value


def _prompt(body: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], None
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in prompt)
    ):
        return None, list(prompt)
    if prompt is None:
        raise ApiError("'prompt' is required", param="prompt")
    raise ApiError(
        "'prompt' must be a string, a list of one string, or a list of token ids", param="prompt"
    )


def parse_request(body: Any, kind: Kind, served_model: str) -> CompletionRequest:
    """Validate a decoded JSON body; raises :class:`ApiError` with a message on bad input."""
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if model != served_model:
        raise ApiError(
            f"The model `{model}` does not exist. This engine serves `{served_model}`.",
            param="model",
        )
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("'messages' must be a non-empty list", param="messages")
        if not all(isinstance(m, dict) for m in messages):
            raise ApiError("every message must be an object", param="messages")
        try:
            text: str | None = render_chat(messages)
        except ValueError as exc:
            raise ApiError(str(exc), param="messages") from exc
        ids = None
    else:
        text, ids = _prompt(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError("'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage"))
    return CompletionRequest(kind, served_model, text, ids, _max_tokens(body), stream,
                             include_usage)  # fmt: skip


_MASK64 = (1 << 64) - 1


def filler(seed: int, prompt_key: int, n: int) -> list[str]:
    """``n`` deterministic output pieces for a prompt (same seed and prompt -> same text)."""
    # A 64-bit LCG (Knuth's MMIX constants): 4x cheaper than a random.Random per request.
    x = xxhash.xxh3_64_intdigest(f"{seed}:{prompt_key}".encode())
    words = _WORDS
    count = len(words)
    out: list[str] = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & _MASK64
        out.append(words[(x >> 33) % count])
    return out


def new_id(kind: Kind) -> str:
    """A response id in OpenAI's style."""
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + os.urandom(12).hex()


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The ``usage`` object, with ``prompt_tokens_details.cached_tokens`` as vLLM reports it."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def full_response(
    req: CompletionRequest, rid: str, text: str, usage_obj: dict[str, Any]
) -> dict[str, Any]:
    """A non-streaming response body."""
    if req.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": req.model,
            "choices": [choice], "usage": usage_obj}  # fmt: skip


class ChunkWriter:
    """Builds SSE events for one streaming response."""

    def __init__(self, req: CompletionRequest, rid: str) -> None:
        self.req = req
        self._head = {
            "id": rid,
            "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": req.model,
        }

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        payload = {**self._head, "choices": choices, **extra}
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        """First chat chunk, carrying the role (completions have none: returns b"")."""
        if self.req.kind != "chat":
            return b""
        return self._event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}])  # fmt: skip

    def token(self, piece: str, last: bool) -> bytes:
        """One content chunk; the last one carries ``finish_reason``."""
        reason = "length" if last else None
        if self.req.kind == "chat":
            choice = {"index": 0, "delta": {"content": piece}, "logprobs": None,
                      "finish_reason": reason}  # fmt: skip
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}
        return self._event([choice])

    def usage(self, usage_obj: dict[str, Any]) -> bytes:
        """Final usage chunk (empty choices), sent when ``stream_options.include_usage``."""
        return self._event([], usage=usage_obj)

    @staticmethod
    def done() -> bytes:
        """The stream terminator."""
        return b"data: [DONE]\n\n"


def models_body(model: str, created: int) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                        "owned_by": "kvgate-emulator", "root": model}]}  # fmt: skip
