"""Conversations in a trace that carries no session id, inferred from its block ids (pure).

A chat client resends the whole conversation every turn, so a later turn's prompt starts with
the previous turn's prompt. A request therefore continues the conversation whose latest prompt
it extends: it contains every full block of that prompt (its last block may have been partial,
and a partial block's id changes once it fills up), and by at least one block beyond its
family's template. Of several such conversations, the one whose latest prompt is longest wins
(the closest), then the most recent. A request that extends none starts a conversation.

Families and templates. Requests with the same first block are a family (one application: its
system prompt, tool schemas). A family's template is the prefix all its requests share:
extending only that proves nothing, whatever the other families share (with several families
the whole trace shares nothing, and a request holding only its template would be "extended" by
every later request of its family). A family whose requests form one line (each, in arrival
order, resends the previous one's full blocks) is one conversation's turns, not a template
several share: it has no template.

Timing. A turn is sent after the previous turn's answer, so a request cannot continue a
conversation whose latest request could not have been answered by the time it arrives; the
caller gives that time (`busy_until`, see `workload.trace`).

An explicit id in a record (`session_id` or `conversation_id`) is used as given; such requests
still count as their conversation's latest prompt, so records without an id can continue them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise


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


def _one_line(prompts: Sequence[Sequence[int]]) -> bool:
    """Whether each prompt (in arrival order) starts with the previous one's full blocks."""
    return all(b[:len(a) - 1] == a[:-1] for a, b in pairwise(prompts))


def family_templates(prompts: Sequence[Sequence[int]]) -> dict[int, int]:
    """First block id -> template depth in blocks, for prompts in arrival order (see the
    module docstring)."""
    families: dict[int, list[Sequence[int]]] = {}
    for ids in prompts:
        families.setdefault(ids[0], []).append(ids)
    return {first: 0 if _one_line(family) else shared_prefix_blocks(family)
            for first, family in families.items()}


@dataclass(slots=True)
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    # Conversations whose latest prompt's full blocks end exactly here: name -> its order.
    ends: dict[str, int] = field(default_factory=dict)


class ConversationIndex:
    """Assigns requests, in arrival order, to conversations (see the module docstring).

    ``templates``: first block id -> template depth (`family_templates`); a family it does not
    name has none."""

    def __init__(self, templates: Mapping[int, int]) -> None:
        self._templates = templates
        self._root = _Node()
        self._latest: dict[str, _Node] = {}  # conversation -> where its latest prompt ends
        self._answered: dict[str, float] = {}  # conversation -> earliest its latest is answered
        self._order = 0
        self._names: set[str] = set()
        self.continuations = 0  # requests inferred to continue a conversation
        self.too_early = 0  # requests extending a conversation not yet answered: not its turn

    def template(self, ids: Sequence[int]) -> int:
        """Template depth of the family of a prompt with block ids ``ids``."""
        return self._templates.get(ids[0], 0) if ids else 0

    def held(self, ids: Sequence[int]) -> int:
        """How many leading blocks of ``ids`` an earlier prompt had as full blocks."""
        node, depth = self._root, 0
        for block in ids:
            child = node.children.get(block)
            if child is None:
                break
            node, depth = child, depth + 1
        return depth

    def busy_until(self, conversation: str, answered: float) -> None:
        """Its latest request cannot have been answered before ``answered``."""
        self._answered[conversation] = answered

    def assign(self, ids: Sequence[int], explicit: str | None = None, name_hint: str = "",
               arrival: float = 0.0) -> str:
        """The conversation of a prompt with block ids ``ids`` arriving at ``arrival``;
        ``explicit``: the record's own id. A new conversation is named ``name_hint`` (made
        unique with a suffix). Until `busy_until` says otherwise it counts as answered at once."""
        conversation = explicit
        if conversation is None:
            conversation = self._continued(ids, arrival)
            self.continuations += conversation is not None
        if conversation is None:
            conversation = self._new_name(name_hint or "conversation")
        self._names.add(conversation)
        self._record(conversation, ids)
        self._answered[conversation] = arrival
        return conversation

    def _continued(self, ids: Sequence[int], arrival: float) -> str | None:
        template = self.template(ids)
        node = self._root
        extended: list[_Node] = []  # nodes past the template where some latest prompt ends
        for depth, block in enumerate(ids, 1):
            child = node.children.get(block)
            if child is None:
                break
            node = child
            if depth > template and node.ends:
                extended.append(node)
        busy = False
        for node in reversed(extended):  # the longest latest prompt first
            for name in sorted(node.ends, key=node.ends.__getitem__, reverse=True):
                if arrival >= self._answered[name]:  # then the most recent answered
                    self.too_early += busy
                    return name
                busy = True
        self.too_early += busy
        return None

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
