"""The control plane and the admin API without reading every binding for every answer: the
leader finds a failed engine's sessions with one paged read (not a mirror), and only when the
set of leaving engines changes; `sessions list` pages; session counts come from etcd up to
EXACT_LIMIT bindings and from a synced ext_proc replica past it."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

import control_plane.counts
from control_plane.failover import Failover
from control_plane.operations import Operations
from ext_proc.service import ExtProcOptions, ExtProcService
from kvgate.bindings.bulk import write_bindings
from kvgate.bindings.model import Binding
from kvgate.config import load_text
from kvgate.config.model import HostPort
from kvgate.endpoints import EndpointDirectory, EndpointRecord, sync_membership
from kvgate.etcd import EtcdClient
from tests.admin.admin_helpers import run_cli
from tests.failsafe.failsafe_helpers import running_control_plane, write_config
from tests.scale.scale_helpers import sessions
from tests.support.polling import eventually

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def _config(etcd: str, prefix: str, health: str = "") -> str:
    """`health`: the coder pool's health settings (its addresses answer no probe)."""
    return (f"etcd: {{endpoints: ['{etcd}'], prefix: '{prefix}'}}\n"
            f"pools:\n"
            f"  - {{name: coder, kv_pool: ddr-a, endpoints: [{A}, {B}, "
            f"{{address: '{C}', kv_pool: ddr-b}}]{health}}}\n"
            f"  - {{name: chat, endpoints: ['10.0.1.1:8000']}}\n"
            f"routes: [{{match: {{prefix: /chat/}}, pool: chat}}, {{match: {{prefix: /}}, "
            f"pool: coder}}]\n")


async def _bound(client: EtcdClient, prefix: str) -> dict[str, tuple[str, int]]:
    base = f"{prefix}bindings/coder/".encode()
    kvs, _ = await client.get_prefix(base)
    return {kv.key[len(base):].decode(): (json.loads(kv.value)["endpoint"], kv.lease)
            for kv in kvs}


async def test_the_leader_finds_a_failed_engines_sessions_in_one_paged_read(
    etcd, prefix: str
) -> None:
    client = EtcdClient([etcd.endpoint], page_size=100)
    try:
        config = load_text(_config(etcd.endpoint, prefix))
        lease = await client.grant_lease(3600)
        names = sessions(3000)
        await write_bindings(client, prefix, (
            Binding(s, "coder", (A, B, C)[i % 3], hash=i + 1) for i, s in enumerate(names)), lease)
        directory = EndpointDirectory(config)
        failover = Failover(client, directory, prefix, 1.25)
        assert await failover.sweep() == 0  # nothing leaving: one read to learn that
        assert failover.scanned == 3000
        assert await failover.sweep() == 0 and failover.scanned == 3000  # not read again

        directory.set_record(EndpointRecord("coder", A, "ddr-a", healthy=False))
        for address, kv in ((B, "ddr-a"), (C, "ddr-b")):
            directory.set_record(EndpointRecord("coder", address, kv))
        assert await failover.sweep() == 1000
        after = await _bound(client, prefix)
        assert len(after) == 3000 and not [s for s, (e, _) in after.items() if e == A]
        assert {lease_id for _, lease_id in after.values()} == {lease}  # idle expiry kept
        load = Counter(e for e, _ in after.values())
        bound = math.ceil(1.25 * 3001 / 2)  # the pool's load bound over the 2 engines left
        assert load[B] == bound and load[C] == 3000 - bound  # its DDR sibling first, to its bound
        scanned = failover.scanned
        assert await failover.sweep() == 0 and failover.scanned == scanned  # all moved: quiet
        directory.set_record(EndpointRecord("coder", A, "ddr-a"))  # back; then C fails
        directory.set_record(EndpointRecord("coder", C, "ddr-b", healthy=False))
        assert await failover.sweep() == 3000 - bound  # a change: read once more, move them
        assert failover.scanned == scanned + 3000
    finally:
        await client.close()


async def test_sessions_list_pages_in_key_order(etcd, prefix: str) -> None:
    client = EtcdClient([etcd.endpoint])
    try:
        await sync_membership(client, load_text(_config(etcd.endpoint, prefix)), "t", claim=True)
        coder, chat = sessions(230, "coder"), sessions(40, "chat")
        await write_bindings(client, prefix, [Binding(s, "coder", A) for s in coder]
                             + [Binding(s, "chat", "10.0.1.1:8000") for s in chat])
        operations = Operations(client, prefix)
        seen: list[str] = []
        after = None
        while True:
            page = await operations.list_sessions(limit=100, after=after)
            seen.extend(b.binding.key for b in page.sessions)
            if page.next_after is None:
                break
            assert page.next_after == seen[-1]
            after = page.next_after
        assert seen == sorted(f"chat/{s}" for s in chat) + sorted(f"coder/{s}" for s in coder)
        in_pool = await operations.list_sessions("coder", limit=10, after=sorted(coder)[219])
        assert [b.binding.session for b in in_pool.sessions] == sorted(coder)[220:]
        assert in_pool.next_after is None
    finally:
        await client.close()


async def test_past_the_exact_limit_counts_come_from_a_synced_ext_proc(
    etcd, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_plane.counts, "EXACT_LIMIT", 100)
    # Counts, not health: on a busy machine the default probes (2 s x 3) failed A and moved its
    # sessions before the count was read.
    config = load_text(_config(etcd.endpoint, prefix, ", health: {interval: 1h}"))
    client = EtcdClient([etcd.endpoint])
    admin = str(config.control_plane.admin)
    await sync_membership(client, config, "test", claim=True)
    await write_bindings(client, prefix, (Binding(s, "coder", (A, C)[i % 2])
                                          for i, s in enumerate(sessions(300))))
    ext_proc = ExtProcService(config, ExtProcOptions(
        listen=HostPort("127.0.0.1", 0), metrics=None, etcd_endpoints=(etcd.endpoint,),
        identity="replica-1"))
    async with running_control_plane(config, write_config(tmp_path / "kvgate.yaml", config)):
        try:
            unknown = json.loads((await run_cli("status", "--json", admin=admin)).out)
            assert "300 bindings in etcd" in unknown["sessions_note"]
            assert "unknown" in unknown["sessions_note"]
            await ext_proc.start()

            async def counted() -> bool:
                listed = await run_cli("endpoints", "list", "--pool", "coder", admin=admin)
                return "ext_proc replica-1" in listed.out

            await eventually(counted, within=15)
            found = json.loads((await run_cli("endpoints", "list", "--json", admin=admin)).out)
            assert {e["address"]: e["sessions"] for e in found if e["pool"] == "coder"} == \
                {A: 150, B: 0, C: 150}
            shown = await run_cli("sessions", "show", sessions(300)[7], admin=admin)
            assert shown.code == 0 and C in shown.out
            first = await run_cli("sessions", "list", "--limit", "2", admin=admin)
            assert first.out.strip().splitlines()[-1].startswith("more: --after coder/")
        finally:
            await ext_proc.stop(grace=0)
            await client.close()
