"""A large prefix read in windows (kvgate.etcd.scan): every key once, at one revision, whatever
the keys look like (UUIDs, time-ordered UUIDs, other strings, keys right under the prefix)."""

from __future__ import annotations

import uuid

from kvgate.bindings.bulk import write_bindings
from kvgate.bindings.model import Binding
from kvgate.etcd import EtcdClient
from kvgate.etcd.scan import scan


async def test_a_windowed_scan_reads_what_a_plain_paged_read_reads(etcd, prefix: str) -> None:
    client = EtcdClient([etcd.endpoint], page_size=100)
    try:
        time_ordered = [f"0190a1b2-c3d4-7{i:03x}-8000-{i:012x}" for i in range(2500)]  # UUIDv7
        names = [str(uuid.uuid4()) for _ in range(2500)] + time_ordered + [
            "odd-one", "Zed", "\x01x", "~", "0190a1b2-c3d4-7zzz"]
        await write_bindings(client, prefix, [Binding(n, "coder", "10.0.0.1:1") for n in names]
                             + [Binding(n, "chat", "10.0.0.1:1") for n in names[:700]])
        await client.put(f"{prefix}bindings/not-in-a-pool".encode(), b"{}")
        base = f"{prefix}bindings/".encode()
        plain = [kv.key async for page, _ in client.pages(base) for kv in page]
        windowed, revisions = [], set()
        async for page, revision in scan(client, base):
            windowed += [kv.key for kv in page]
            revisions.add(revision)
        assert sorted(windowed) == plain and len(plain) == 5005 + 700 + 1  # each key once
        assert len(revisions) == 1
        pool = base + b"coder/"
        assert sorted([kv.key async for page, _ in scan(client, pool) for kv in page]) == \
            [key for key in plain if key.startswith(pool)]
        assert [kv async for page, _ in scan(client, base + b"nothing/") for kv in page] == []
    finally:
        await client.close()
