"""The issue's run of `kvgate up`'s supervision (tests/gateway/test_up_supervision.py has the
short one): the control plane, an ext_proc replica, the embedded etcd and Envoy SIGKILLed in
turn under traffic, each followed for 20 s. Targets: at most 1 % of requests failed in the 20 s
after each of the first three; Envoy serving again within 5 s; every child back within 10 s;
no binding lost.
    python -m pytest -m chaos tests/chaos/test_up_children.py -s
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.gateway.test_up_supervision import check_targets, each_child_killed_in_turn
from tests.support.upstreams import Upstream


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_each_child_killed_in_turn_for_twenty_seconds(
        tmp_path: Path, upstreams: Callable[[int], Awaitable[list[Upstream]]],
        prefix: str) -> None:
    kills, lost, output = await each_child_killed_in_turn(tmp_path, upstreams, prefix,
                                                          window_s=20.0, sessions=32)
    print("\n".join(str(k) for k in kills))
    check_targets(kills, lost, output)
