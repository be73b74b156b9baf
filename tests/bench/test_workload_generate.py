"""What the generated workloads share (workload.generate): each session draws from its own stream,
and the segments a session adds share no key with the prefixes all sessions share."""

from __future__ import annotations

from workload.agentic import HARNESS_KEY, AgenticCodingOptions, agentic_coding
from workload.bank import SYSTEM_KEY, BankCodingOptions, bank_coding
from workload.model import Workload


def _by_session(workload: Workload) -> dict[str, list[tuple[float, tuple[object, ...]]]]:
    sessions: dict[str, list[tuple[float, tuple[object, ...]]]] = {}
    for r in workload.requests:
        sessions.setdefault(r.session, []).append((r.arrival, tuple(r.segments)))
    return sessions


def test_a_session_is_the_same_whatever_the_number_of_sessions() -> None:
    for make in (lambda n: bank_coding(BankCodingOptions(sessions=n, duration_s=600)),
                 lambda n: agentic_coding(AgenticCodingOptions(sessions=n, duration_s=600))):
        few, many = _by_session(make(5)), _by_session(make(40))
        assert few and {s: many[s] for s in few} == few


def test_a_sessions_own_segments_share_no_key_with_the_shared_prefixes() -> None:
    for workload, shared in ((bank_coding(BankCodingOptions(sessions=20)), SYSTEM_KEY),
                             (agentic_coding(AgenticCodingOptions(sessions=5)), HARNESS_KEY)):
        for r in workload.requests:
            first, *own = r.segments
            assert first.key == shared
            assert own and all(s.key >= 1 << 62 for s in own)
