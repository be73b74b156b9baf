"""vLLM's context-length check, as its OpenAI server answers a prompt past ``max_model_len``
(pure: numbers in, an :class:`ApiError` or a token count out).

What vLLM does (``vllm/renderers/params.py``, ``TokenizeParams``; a chat or completion request
builds it in ``build_tok_params`` with ``max_total_tokens = max_model_len`` and
``max_output_tokens = max_tokens or 0``, ``max_completion_tokens`` first for chat):

- ``__post_init__``: ``max_tokens`` above ``max_model_len`` is refused before anything else.
- ``get_encode_kwargs``: the prompt is tokenized to at most ``max_input_tokens + 1`` tokens
  (``max_input_tokens = max_model_len - max_output_tokens``), so a longer prompt is only known
  to have "at least" that many.
- ``_token_len_check``: more than ``max_input_tokens`` prompt tokens is refused with a
  ``VLLMValidationError(parameter="input_tokens")``, which
  ``OpenAIServing.create_error_response`` (``vllm/entrypoints/openai/engine/serving.py``) turns
  into HTTP 400, ``{"error": {"message", "type": "BadRequestError", "param": "input_tokens",
  "code": 400}}``; the exception's text ends with ``(parameter=..., value=...)``.
- A request that names no ``max_tokens`` is not checked for its output and generates at most
  what is left of the context (``vllm/entrypoints/utils.py`` ``get_max_tokens``).

The wording is that of current vLLM releases, as clients quote it ("... However, you requested
N output tokens and your prompt contains at least M input tokens, for a total of at least T
tokens ..."); the snapshot of ``params.py`` read for this (commit 017638d7) words the same
check "You passed M input tokens and requested N output tokens. However, the model's context
length is only L tokens, ...".
"""

from __future__ import annotations

from emulator.openai_api import ApiError


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """Raise :class:`ApiError` (400) as vLLM refuses a prompt of ``prompt_tokens`` asking for
    ``max_tokens`` (None: not given) on an engine of ``max_model_len``."""
    requested = max_tokens or 0
    if requested > max_model_len:
        raise ApiError(
            f"max_tokens={requested} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. "
            f"(parameter=max_tokens, value={requested})", param="max_tokens")
    max_input = max_model_len - requested
    if prompt_tokens > max_input:
        seen = max_input + 1  # vLLM stops tokenizing here: "at least"
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {requested} output tokens and your prompt contains at least {seen} "
            f"input tokens, for a total of at least {seen + requested} tokens. Please reduce "
            f"the length of the input prompt or the number of requested output tokens. "
            f"(parameter=input_tokens, value={seen})", param="input_tokens")


def output_tokens(prompt_tokens: int, max_tokens: int | None, default: int,
                  max_model_len: int) -> int:
    """Tokens to generate: ``max_tokens`` when given (checked already), else ``default`` cut to
    what the context has left (at least one)."""
    if max_tokens is not None:
        return max_tokens
    return max(1, min(default, max_model_len - prompt_tokens))
