"""The real benchmark's text and the simulator's segment hashes describe the same prompts."""

from __future__ import annotations

import itertools

from bench_helpers import small_bank

from emulator.prefix_cache import block_hashes
from emulator.tokenize import Tokenizer
from workload.hashing import BlockHasher
from workload.model import Request, Segment
from workload.text import TextMaker


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_text_has_exactly_the_workloads_token_count() -> None:
    workload = small_bank(sessions=4)
    texts = TextMaker()
    tokenizer = Tokenizer()
    for request in workload.requests:
        assert len(tokenizer.encode(texts.prompt(request))) == request.prompt_tokens


def test_segment_hashes_share_blocks_exactly_where_the_emulators_hashes_do() -> None:
    workload = small_bank(sessions=5)
    texts = TextMaker()
    tokenizer = Tokenizer()
    for block in (16, 128):
        hasher = BlockHasher(block)
        real = []
        ours = []
        for request in workload.requests:
            real.append(block_hashes(tokenizer.encode(texts.prompt(request)), block))
            ours.append(hasher.hashes(request))
        assert [len(h) for h in real] == [len(h) for h in ours]
        shared = 0
        for i, j in itertools.combinations(range(len(real)), 2):
            common = _common(real[i], real[j])
            assert _common(ours[i], ours[j]) == common
            shared += common > 0
        assert shared > 0  # the system prompt is shared across sessions


def test_a_truncated_segment_is_a_prefix_of_the_full_one() -> None:
    texts = TextMaker()
    full = Request(0.0, "s", [Segment(42, 512)], 1, 1)
    cut = Request(0.0, "s", [Segment(42, 300)], 1, 1)
    assert texts.prompt(full).startswith(texts.prompt(cut))
    hasher = BlockHasher(100)
    assert hasher.hashes(full)[:3] == hasher.hashes(cut)
