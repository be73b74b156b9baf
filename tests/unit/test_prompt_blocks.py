"""The prefix step live: a request body's prompt hashed in character blocks (kvgate.routing.
prompt_blocks, the Gateway API Inference Extension's scorer's way), the pipeline asking for the
prompt only where it weighs it, and the Envoy resources that let ext_proc ask."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xxhash
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)

from control_plane.resources.listener import gateway_listener
from control_plane.resources.routes import pd_processing_mode, route_configuration
from ext_proc.prompt_stream import body_mode
from kvgate.bindings.memory import MemoryBindingStore
from kvgate.config import load_text
from kvgate.config.load import check_text
from kvgate.contract.envoy import PROMPT_METADATA_KEY
from kvgate.contract.states import MoveReason
from kvgate.endpoints import EndpointDirectory
from kvgate.placement import place, session_hash
from kvgate.placement.cost import EngineCost
from kvgate.placement.live import LoadBoard
from kvgate.routing import Pipeline, build_policy
from kvgate.routing.decision import Outcome
from kvgate.routing.prompt_blocks import CHARS_PER_TOKEN, PromptBlocks, prompt_text

TEMPLATE = "You are a coding agent. Tools: read_file(path), write_file(path, text).\n" * 40
BLOCKS = PromptBlocks(16)  # 64 bytes a block, as the scorer's default (16 tokens × 4)


def chat(*messages: tuple[str, Any], **extra: Any) -> bytes:
    return json.dumps({"model": "m", **extra,
                       "messages": [{"role": r, "content": c} for r, c in messages]}).encode()


def test_the_same_template_gives_the_same_leading_blocks_whatever_follows() -> None:
    fix, rename = "Fix the parser. " * 10, "Rename the module, please. " * 10
    one = BLOCKS.of_body(chat(("system", TEMPLATE), ("user", fix)))
    two = BLOCKS.of_body(chat(("system", TEMPLATE), ("user", rename)))
    shared = len(TEMPLATE) // BLOCKS.block_chars  # blocks wholly inside the template
    assert shared >= 40 and one[:shared] == two[:shared]
    assert one[shared + 1:] and not set(one[shared + 1:]) & set(two)  # the questions differ
    # Key order and escaping in the JSON do not matter: the text is hashed, not the JSON.
    reordered = json.dumps({"messages": [{"content": TEMPLATE, "role": "system"},
                                         {"content": fix, "role": "user"}],
                            "model": "m"}, ensure_ascii=True, indent=2).encode()
    assert BLOCKS.of_body(reordered) == one


def test_blocks_chain_as_the_scorer_hashes_them() -> None:
    """xxHash64 of each block's bytes followed by the previous hash (little-endian), from
    xxHash64 of the model's name (and cache_salt); a trailing partial block is dropped."""
    text = "x" * (3 * 64 + 10)
    root = xxhash.xxh64_intdigest(b"m")
    first = xxhash.xxh64_intdigest(b"x" * 64 + root.to_bytes(8, "little"))
    second = xxhash.xxh64_intdigest(b"x" * 64 + first.to_bytes(8, "little"))
    assert BLOCKS.of_text(text, root)[:2] == [first, second]
    assert len(BLOCKS.of_text(text, root)) == 3
    # Another model or another cache_salt shares no block.
    body = {"prompt": text}
    plain = BLOCKS.of_body(json.dumps({**body, "model": "m"}).encode())
    assert plain == BLOCKS.of_text(text, root)
    assert not set(plain) & set(BLOCKS.of_body(json.dumps({**body, "model": "n"}).encode()))
    salted = BLOCKS.of_body(json.dumps({**body, "model": "m", "cache_salt": "s"}).encode())
    assert not set(plain) & set(salted)


def test_at_most_max_blocks_and_short_or_odd_bodies_give_none() -> None:
    assert len(PromptBlocks(16, max_blocks=5).of_text("y" * 10_000)) == 5
    assert BLOCKS.of_body(chat(("user", "hi"))) == []  # shorter than one block
    assert BLOCKS.of_body(b"not json") == []
    assert BLOCKS.of_body(b"[1, 2]") == []
    assert BLOCKS.of_body(json.dumps({"input": "x" * 500}).encode()) == []  # no prompt
    assert BLOCKS.of_body(b"\xff\xfe") == []
    with pytest.raises(ValueError, match="block_tokens"):
        PromptBlocks(0)


def test_prompt_text_reads_chat_parts_and_completions() -> None:
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                       {"type": "image_url"},
                                                       {"type": "text", "text": "b"}]}]}
    assert prompt_text(parts).endswith("ab")
    assert prompt_text({"prompt": "p"}) == "p"
    assert prompt_text({"prompt": ["first", "second"]}) == "first"
    # A role's text cannot run into its content: ("ab", "c") is not ("a", "bc").
    assert (prompt_text({"messages": [{"role": "ab", "content": "c"}]})
            != prompt_text({"messages": [{"role": "a", "content": "bc"}]}))
    assert BLOCKS.block_chars == 16 * CHARS_PER_TOKEN == 64
    assert PromptBlocks(16, 5.3).block_chars == 85  # the bench's body bytes per token


CONFIG = load_text("placement: {load_factor: 2.0, load_gate: {prefix_placement: true}}\n"
                   "pools: [{name: p, kv_pool: a, endpoints: [10.0.0.1:1, 10.0.0.2:1, "
                   "10.0.0.3:1]}]\n")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pipeline(config: Any = CONFIG, clock: Clock | None = None) -> Pipeline:
    gate = config.placement.load_gate
    policy = build_policy(gate, EngineCost(), LoadBoard(), clock=clock or Clock(),
                          block_tokens=16)
    return Pipeline(MemoryBindingStore(), EndpointDirectory(config), 2.0, policy=policy)


async def test_the_pipeline_asks_for_the_prompt_of_new_sessions_only() -> None:
    clock = Clock()
    pipeline = _pipeline(clock=clock)
    template = BLOCKS.of_body(chat(("system", TEMPLATE), ("user", "Fix the parser.")))
    asked = await pipeline.decide("p", b"s-0", 1000, prompt=True)
    assert asked.wants_prompt and not asked.endpoints
    assert pipeline._store.count("p") == 0  # nothing bound while it waits for the prompt
    placed = await pipeline.decide("p", b"s-0", 1000, blocks=template)
    assert placed.outcome is Outcome.NEW and not placed.wants_prompt
    # Its next turn is sticky: decided from its headers, the prompt not asked for.
    again = await pipeline.decide("p", b"s-0", 1000, prompt=True)
    assert again.outcome is Outcome.STICKY and again.endpoints == placed.endpoints
    clock.now += 60.0  # what the gate booked for those turns is done
    # Another new session with the same template, whose ring would put it elsewhere, lands
    # where the template is held.
    view = EndpointDirectory(CONFIG).view("p")
    other = next(f"s-{n}".encode() for n in range(1, 100)
                 if place(view, session_hash(f"s-{n}".encode()), {}, 1.0) != placed.endpoints[0])
    assert (await pipeline.decide("p", other, 1000, prompt=True)).wants_prompt
    assert (await pipeline.decide("p", other, 1000, blocks=template)).endpoints[0] == (
        placed.endpoints[0])
    # Without the prefix step nothing is asked: the gate decides as it always did.
    off = _pipeline(load_text("pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"))
    assert (await off.decide("p", b"s-0", 1000, prompt=True)).outcome is Outcome.NEW


def test_the_gateway_lets_ext_proc_ask_for_bodies_only_with_the_prefix_step() -> None:
    on = load_text("placement: {load_gate: {prefix_placement: true}}\n"
                   "pools: [{name: p, endpoints: [10.0.0.1:1]}]\n")
    off = load_text("pools: [{name: p, endpoints: [10.0.0.1:1]}]\n")
    assert body_mode() == pd_processing_mode()  # the one override the filter allows

    def ext_proc(config: Any) -> Any:
        manager = hcm.HttpConnectionManager()
        gateway_listener(config).filter_chains[0].filters[0].typed_config.Unpack(manager)
        found = ext_proc_pb2.ExternalProcessor()
        next(f for f in manager.http_filters if "ext_proc" in f.name).typed_config.Unpack(found)
        return found

    def marked(config: Any) -> bool:
        route = route_configuration(config).virtual_hosts[0].routes[0]
        return PROMPT_METADATA_KEY.encode() in b"".join(
            v.value for v in route.typed_per_filter_config.values())

    assert ext_proc(on).allow_mode_override
    assert list(ext_proc(on).allowed_override_modes) == [pd_processing_mode()]
    assert ext_proc(on).processing_mode.request_body_mode == pd_processing_mode().NONE
    assert marked(on)
    assert not ext_proc(off).allow_mode_override and not marked(off)


async def test_a_move_for_load_asks_for_the_prompt_a_sticky_turn_does_not() -> None:
    clock, board = Clock(), LoadBoard()
    policy = build_policy(CONFIG.placement.load_gate, EngineCost(), board, clock=clock,
                          block_tokens=16)
    pipeline = Pipeline(MemoryBindingStore(), EndpointDirectory(CONFIG), 2.0, policy=policy)
    template = BLOCKS.of_body(chat(("system", TEMPLATE), ("user", "Fix the parser.")))
    placed = (await pipeline.decide("p", b"s-0", 1000, blocks=template)).endpoints[0]
    clock.now += 60.0
    assert (await pipeline.decide("p", b"s-0", 1000, prompt=True)).outcome is Outcome.STICKY
    clock.now += 60.0
    board.routed(placed, clock.now, 20.0)  # 20 s queued there: a sibling answers sooner
    assert (await pipeline.decide("p", b"s-0", 1000, prompt=True)).wants_prompt
    moved = await pipeline.decide("p", b"s-0", 1000, blocks=template)
    assert moved.outcome is Outcome.REBIND and moved.reason is MoveReason.LOAD
    assert moved.endpoints[0] != placed


def test_the_prefix_step_over_http_is_warned_about() -> None:
    pools = "pools: [{name: p, endpoints: [10.0.0.1:1]}]\n"
    step = "placement: {load_gate: {prefix_placement: true}}\n"
    (warning,) = [str(w) for w in check_text(pools + step + "ext_proc: {transport: http}\n")
                  .warnings]
    assert "placement.load_gate.prefix_placement: ext_proc over HTTP reads no request body" in (
        warning)
    assert check_text(pools + step).warnings == ()
