"""What only the HTTP transport needs: the pool travels in a request header the route sets, and a
client cannot forge it (gRPC carries it as stream metadata no client can reach)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from kvgate.config import load_text
from kvgate.config.dump import to_dict
from kvgate.contract.envoy import POOL_HEADER
from kvgate.etcd import EtcdClient
from kvgate.session import normalize_session
from tests.support.stack import gateway_config, running_stack


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_a_client_sent_pool_header_is_ignored_and_never_reaches_an_engine(
    tmp_path: Path, upstreams, prefix: str, transport: str
) -> None:
    coder, chat = await upstreams(2), await upstreams(2)
    data = to_dict(gateway_config([u.address for u in coder], prefix=prefix,
                                  transport=transport))
    data["pools"].append({**data["pools"][0], "name": "chat",
                          "endpoints": [u.address for u in chat]})
    data["routes"] = [{"match": {"prefix": "/chat/"}, "pool": "chat"},
                      {"match": {"prefix": "/"}, "pool": "coder"}]
    config = load_text(yaml.safe_dump(data))
    sessions = {f"coder-{i}": ("/v1/x", "chat") for i in range(6)}
    sessions |= {f"chat-{i}": ("/chat/x", "coder") for i in range(6)}
    async with running_stack(config, tmp_path) as stack:
        async with httpx.AsyncClient(base_url=f"http://{config.listener}", timeout=30) as http:
            for session, (path, forged) in sessions.items():
                reply = await http.get(path, headers={"x-session-id": session,
                                                      POOL_HEADER: forged})
                assert reply.status_code == 200, reply.text
        client = EtcdClient(stack.etcd_endpoints)
        try:
            kvs, _ = await client.get_prefix(f"{prefix}bindings/".encode())
        finally:
            await client.close()
    # Each session bound in its route's pool (with two pools and no pool known, ext_proc would
    # bind nothing; with the forged one, the other pool).
    bound = {kv.key.decode().split("/bindings/", 1)[1]: json.loads(kv.value)["endpoint"]
             for kv in kvs}
    expected_pool = {"coder": "coder", "chat": "chat"}
    assert set(bound) == {f"{expected_pool[s.split('-')[0]]}/{normalize_session(s.encode())}"
                          for s in sessions}
    for upstream in [*coder, *chat]:
        for headers in upstream.seen_headers:
            assert POOL_HEADER not in headers
