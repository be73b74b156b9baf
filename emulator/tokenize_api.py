"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` (pure: decoded JSON in, dicts out).

Shapes as vLLM 0.32 serves them (``vllm/entrypoints/serve/tokenize/protocol.py``):

- tokenize, completion form: ``{model?, prompt, add_special_tokens=true, return_token_strs=false}``;
  chat form: ``{model?, messages, add_generation_prompt=true, continue_final_message=false,
  add_special_tokens=false, return_token_strs=false, ...}`` → ``{count, max_model_len, tokens,
  token_strs}``;
- detokenize: ``{model?, tokens}`` → ``{prompt}``.

The ids are the emulator's own (:class:`emulator.tokenize.Tokenizer`), the very ids its completions
count and cache, so a router that tokenizes here sees the blocks the engine caches. The emulated
tokenizer has no BOS token, so ``add_special_tokens`` changes nothing (as with Qwen2.5's). Other
fields (``tools``, ``chat_template``, ...) are accepted and ignored, as vLLM accepts extra fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from emulator.openai_api import ApiError
from emulator.tokenize import Tokenizer, render_chat

MAX_TOKEN_ID = 2**63 - 1  # vLLM's bound on a detokenize id


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    return body


def _check_model(body: Mapping[str, Any], served_model: str) -> None:
    """vLLM answers 404 for a model it does not serve; no model means the served one."""
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(f"The model `{model}` does not exist. Valid aliases: {served_model}.",
                       status=404, param="model")


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None and name == "return_token_strs":  # Optional[bool] in vLLM
        return False
    if not isinstance(value, bool):
        raise ApiError(f"'{name}' must be a boolean", param=name)
    return value


def _chat_text(body: Mapping[str, Any]) -> str:
    messages = body["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ApiError("'messages' must be a list of message objects", param="messages")
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise ApiError("Cannot set both `continue_final_message` and `add_generation_prompt` "
                       "to True.", param="continue_final_message")
    generation = _flag(body, "add_generation_prompt", True)
    continue_final = _flag(body, "continue_final_message", False)
    _flag(body, "add_special_tokens", False)
    try:
        return render_chat(messages, add_generation_prompt=generation and not continue_final,
                           continue_final_message=continue_final)
    except ValueError as exc:
        raise ApiError(str(exc), param="messages") from exc


def tokenize(body: Any, served_model: str, tokenizer: Tokenizer,
             max_model_len: int) -> dict[str, Any]:
    """``POST /tokenize``; raises :class:`ApiError` on a bad request."""
    body = _object(body)
    _check_model(body, served_model)
    has_prompt, has_messages = "prompt" in body, "messages" in body
    if has_prompt == has_messages:
        raise ApiError("give either 'prompt' (a string) or 'messages' (a chat)",
                       param="prompt" if has_messages else None)
    if has_messages:
        text = _chat_text(body)
    else:
        text = body["prompt"]
        if not isinstance(text, str):
            raise ApiError("'prompt' must be a string", param="prompt")
        _flag(body, "add_special_tokens", True)
    tokens = tokenizer.encode(text)
    strs = [tokenizer.piece(t) for t in tokens] if _flag(body, "return_token_strs", False) else None
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens,
            "token_strs": strs}


def detokenize(body: Any, served_model: str, tokenizer: Tokenizer) -> dict[str, Any]:
    """``POST /detokenize``; raises :class:`ApiError` on a bad request (an id outside the
    vocabulary included)."""
    body = _object(body)
    _check_model(body, served_model)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
            for t in tokens):
        raise ApiError("'tokens' must be a list of non-negative integer token ids",
                       param="tokens")
    try:
        return {"prompt": tokenizer.decode(tokens)}
    except ValueError as exc:
        raise ApiError(str(exc), param="tokens") from exc
