"""A growing conversation in token ids, sent to an engine's OpenAI API (a real vLLM or the
emulator) directly or through the gateway, each turn's usage kept."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import httpx

from real_vllm.fleet import SERVED_MODEL
from tests.support.real_vllm import UPSTREAM_HEADER

VOCAB = range(200, 8000)  # token ids of the tiny model's vocabulary, clear of its specials


@dataclass
class Turn:
    engine: str
    prompt: int
    cached: int
    answer: list[int]


@dataclass
class Conversation:
    """A growing token-id conversation: each turn sends the history, its answer's token ids (as
    the engine generated them) join the history, then a new question."""

    session: str
    seed: int
    context: int = 3000
    question: int = 40
    answer: int = 16
    history: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.history = self._words(self.context)

    def _words(self, n: int) -> list[int]:
        return [self._rng.choice(VOCAB) for _ in range(n)]

    async def turn(self, http: httpx.AsyncClient, url: str,
                   headers: dict[str, str] | None = None) -> Turn:
        prompt = self.history + self._words(self.question)
        body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": self.answer,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        reply = await http.post(f"{url}/v1/completions", json=body, headers=headers or {})
        assert reply.status_code == 200, reply.text
        out = reply.json()
        choice = out["choices"][0]
        answer = choice.get("token_ids") or await _tokens(http, url, choice["text"])
        self.history = prompt + answer
        usage = out["usage"]
        return Turn(reply.headers.get(UPSTREAM_HEADER, url), usage["prompt_tokens"],
                    (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                    answer)


async def _tokens(http: httpx.AsyncClient, url: str, text: str) -> list[int]:
    """An answer's token ids from the engine's /tokenize (the emulator's answers tokenize back
    to what it generated)."""
    reply = await http.post(f"{url}/tokenize", json={"prompt": text,
                                                     "add_special_tokens": False})
    assert reply.status_code == 200, reply.text
    return list(reply.json()["tokens"])
