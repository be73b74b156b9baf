"""Segment text: words of at most six letters, each with a leading space, so the emulator's
tokenizer (regex pieces `` ?[A-Za-z]{1,6}``) makes exactly one token of each word.

A segment's text is the first ``tokens`` words of a stream seeded by its key, so a truncated
segment is a prefix of the full one, as the trace's partial last blocks need.
"""

from __future__ import annotations

import random
import string

from workload.model import Request, Segment

_VOCAB_SIZE = 8192


def vocabulary() -> list[str]:
    """Every word a prompt may contain, each with its leading space (a real engine's tokenizer
    for the bench must know them all: the real-vLLM tier builds its model's from this list)."""
    return _vocabulary()


def _vocabulary() -> list[str]:
    rng = random.Random(0x6B76)
    words: set[str] = set()
    while len(words) < _VOCAB_SIZE:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 6))))
    return [" " + w for w in sorted(words)]


class TextMaker:
    """Turns segments into prompt text; remembers each session's last prompt to extend it."""

    def __init__(self) -> None:
        self._words = _vocabulary()
        self._last: dict[int, tuple[int, str]] = {}  # id(chain) -> (length, text)

    def segment(self, segment: Segment) -> str:
        rng = random.Random(segment.key)
        return "".join(rng.choices(self._words, k=segment.tokens))

    def prompt(self, request: Request, answer: str | None = None) -> str:
        """The request's prompt text (``sum(tokens)`` tokens for the emulator's tokenizer).

        ``answer``: what the engine answered the session's previous turn; it replaces that
        answer's segment (the first one after the previous prompt), as a chat client resends
        the reply it got, not the one the workload imagined."""
        chain_id = id(request.chain)
        done, text = self._last.get(chain_id, (0, ""))
        if done > request.length:
            done, text = 0, ""
        new = request.chain[done : request.length]
        parts = [text]
        if answer is not None and done > 0 and new:
            parts.append(answer)
            new = new[1:]
        parts += (self.segment(s) for s in new)
        text = "".join(parts)
        self._last[chain_id] = (request.length, text)
        return text

    def forget(self, request: Request) -> None:
        """Drop the remembered prompt of the request's chain (after a session's last turn)."""
        self._last.pop(id(request.chain), None)
