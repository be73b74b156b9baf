from __future__ import annotations

import itertools

import pytest

from workload.bank import SYSTEM_KEY, BankCodingOptions, bank_coding


def _shape(options: BankCodingOptions) -> list[tuple[float, str, int, int]]:
    return [(r.arrival, r.session, r.prompt_tokens, r.max_tokens)
            for r in bank_coding(options).requests]


def test_same_seed_same_workload_other_seed_another() -> None:
    options = BankCodingOptions(sessions=50, seed=7)
    assert _shape(options) == _shape(BankCodingOptions(sessions=50, seed=7))
    assert _shape(options) != _shape(BankCodingOptions(sessions=50, seed=8))


def test_turns_extend_the_previous_prompt_and_arrive_in_order() -> None:
    options = BankCodingOptions(sessions=200, seed=1)
    workload = bank_coding(options)
    arrivals = [r.arrival for r in workload.requests]
    assert arrivals == sorted(arrivals)
    assert 0 <= arrivals[0] and arrivals[-1] < options.duration_s
    by_session: dict[str, list] = {}
    for r in workload.requests:
        by_session.setdefault(r.session, []).append(r)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert len(multi) > 100  # multi-turn sessions dominate
    for turns in by_session.values():
        first = turns[0].segments
        assert first[0].key == SYSTEM_KEY and first[0].tokens == options.system_tokens
        assert options.context_min_tokens <= first[1].tokens <= options.context_max_tokens
        for earlier, later in itertools.pairwise(turns):
            assert list(later.segments[: earlier.length]) == list(earlier.segments)
            assert later.length == earlier.length + 2  # previous answer + new question
            # the next question comes after the answer, plus a think time (closed loop); its
            # nominal arrival is as if the answer had streamed at once
            assert turns[0].think_s is None and later.think_s is not None
            assert later.think_s >= 5.0
            assert later.arrival - earlier.arrival == pytest.approx(
                earlier.max_tokens * options.decode_s_per_token + later.think_s)
    following = workload.next_turns()
    index = {id(r): i for i, r in enumerate(workload.requests)}
    for turns in by_session.values():
        links = [following[index[id(r)]] for r in turns]
        assert links == [index[id(r)] for r in turns[1:]] + [-1]


def test_session_starts_ramp_up_to_a_peak() -> None:
    options = BankCodingOptions(sessions=4000, seed=2)
    starts: dict[str, float] = {}
    for r in bank_coding(options).requests:
        starts.setdefault(r.session, r.arrival)
    first_ramp_quarter = sum(1 for t in starts.values() if t < options.ramp_s / 4)
    peak_quarter = sum(1 for t in starts.values() if 2000 <= t < 2000 + options.ramp_s / 4)
    # rate at the start is ramp_start (0.2) of the peak's; allow sampling noise
    assert first_ramp_quarter < 0.45 * peak_quarter
    assert len(starts) == 4000
