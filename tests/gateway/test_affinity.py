"""Sticky sessions through real Envoy + ext_proc + etcd, spread within the load bound (that a
client cannot pick its engine: test_transports.py, on the stack it shares)."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import pytest

from kvgate.etcd import EtcdClient
from kvgate.session import normalize_session
from tests.support.stack import gateway_config, running_stack

# Every test here runs on both of ext_proc's transports.
pytestmark = pytest.mark.parametrize("transport", ["grpc", "http"])


async def test_sessions_stick_and_spread_within_load_factor(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    ups = await upstreams(4)
    config = gateway_config([u.address for u in ups], prefix=prefix, transport=transport)
    async with running_stack(config, tmp_path) as stack:
        seen: defaultdict[str, set[str]] = defaultdict(set)
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            for turn in range(10):
                for s in range(20):
                    reply = await http.get(f"/v1/chat/{turn}", headers={"x-session-id": f"s-{s}"})
                    assert reply.status_code == 200
                    seen[f"s-{s}"].add(reply.json()["upstream"])
        assert all(len(hosts) == 1 for hosts in seen.values()), seen
        per_upstream = Counter(next(iter(hosts)) for hosts in seen.values())
        bound = math.ceil(config.placement.load_factor * 20 / 4)
        assert max(per_upstream.values()) <= bound, per_upstream
        assert len(per_upstream) >= 3, per_upstream
        # They stuck because kvgate bound them: each binding in etcd names the session's upstream.
        client = EtcdClient(stack.etcd_endpoints)
        try:
            kvs, _ = await client.get_prefix(f"{prefix}bindings/coder/".encode())
        finally:
            await client.close()
        bound = {kv.key.decode().rsplit("/", 1)[1]: json.loads(kv.value)["endpoint"] for kv in kvs}
        assert bound == {normalize_session(s.encode()): next(iter(hosts))
                         for s, hosts in seen.items()}
