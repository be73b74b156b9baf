"""Conversations in a trace that carries no session id, inferred from its block ids (pure).

A chat client resends the whole conversation every turn, so a later turn's prompt starts with
the previous turn's prompt. A request therefore continues the conversation whose latest prompt
it extends: it contains every full block of that prompt (its last block may have been partial,
and a partial block's id changes once it fills up), and by at least one block beyond the prefix
every request shares (a system prompt, tool schemas: extending only that proves nothing). Of
several such conversations, the one whose latest prompt is longest wins (the closest), then the
most recent. A request that extends none starts a conversation.

An explicit id in a record (`session_id` or `conversation_id`) is used as given; such requests
still count as their conversation's latest prompt, so records without an id can continue them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def shared_prefix_blocks(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading block ids every prompt has in common."""
    if not prompts:
        return 0
    first = prompts[0]
    depth = len(first)
    for ids in prompts:
        depth = min(depth, len(ids))
        i = 0
        while i < depth and ids[i] == first[i]:
            i += 1
        depth = i
        if depth == 0:
            break
    return depth


@dataclass(slots=True)
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    # Conversations whose latest prompt's full blocks end exactly here: name -> its order.
    ends: dict[str, int] = field(default_factory=dict)


class ConversationIndex:
    """Assigns requests, in arrival order, to conversations (see the module docstring)."""

    def __init__(self, shared_blocks: int) -> None:
        self._shared = shared_blocks
        self._root = _Node()
        self._latest: dict[str, _Node] = {}  # conversation -> where its latest prompt ends
        self._order = 0
        self._names: set[str] = set()

    def assign(self, ids: Sequence[int], explicit: str | None = None,
               name_hint: str = "") -> str:
        """The conversation of a prompt with block ids `ids`; `explicit`: the record's own id.
        A new conversation is named `name_hint` (made unique with a suffix)."""
        conversation = explicit if explicit is not None else self._continued(ids)
        if conversation is None:
            conversation = self._new_name(name_hint or "conversation")
        self._names.add(conversation)
        self._record(conversation, ids)
        return conversation

    def _continued(self, ids: Sequence[int]) -> str | None:
        node = self._root
        best: str | None = None
        for depth, block in enumerate(ids, 1):
            child = node.children.get(block)
            if child is None:
                break
            node = child
            if depth > self._shared and node.ends:
                best = max(node.ends, key=node.ends.__getitem__)  # longest, then most recent
        return best

    def _record(self, conversation: str, ids: Sequence[int]) -> None:
        previous = self._latest.get(conversation)
        if previous is not None:
            previous.ends.pop(conversation, None)
        node = self._root
        for block in ids[:-1]:  # the last block may be partial: the next turn changes its id
            node = node.children.setdefault(block, _Node())
        self._order += 1
        node.ends[conversation] = self._order
        self._latest[conversation] = node

    def _new_name(self, hint: str) -> str:
        name, n = hint, 1
        while name in self._names:
            n += 1
            name = f"{hint}-{n}"
        return name

    @property
    def conversations(self) -> int:
        return len(self._names)
