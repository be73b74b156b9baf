"""The DNS source against a real DNS server (dnsmasq): A records, SRV records, a name it does
not hold, and a server that does not answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvgate.config import load_text
from kvgate.config.sections.discover import DnsSource
from kvgate.discovery.dns import DnsFailure, DnsResolver
from tests.support.dnsmasq import Dnsmasq, available

pytestmark = pytest.mark.skipif(not available(), reason="dnsmasq is not installed "
                                "(apt-get install dnsmasq-base)")


@pytest.fixture
async def dnsmasq(tmp_path: Path) -> AsyncIterator[Dnsmasq]:
    server = Dnsmasq(tmp_path, srv=["_http._tcp.engines.test,engines.test,8001"])
    await server.start()
    yield server
    await server.stop()


def _source(dns: str) -> DnsSource:
    pool = load_text(f"pools: [{{name: coder, kv_pool: kv-a, discover: {{dns: {dns}}}}}]"
                     ).pools[0]
    assert pool.discover is not None and pool.discover.dns is not None
    return pool.discover.dns


async def test_a_records_srv_records_and_missing_names(dnsmasq: Dnsmasq) -> None:
    await dnsmasq.set({"engines.test": ["127.0.0.2", "127.0.0.3"]})
    server = f"server: '{dnsmasq.server}'"
    plain = DnsResolver(_source(f"{{name: engines.test, port: 8000, {server}, weight: 2}}"),
                        "kv-a")
    found = await plain.resolve()
    assert [(f.address, f.kv_pool, f.weight) for f in found] == [
        ("127.0.0.2:8000", "kv-a", 2), ("127.0.0.3:8000", "kv-a", 2)]
    srv = DnsResolver(_source(f"{{name: _http._tcp.engines.test, {server}, kv_pool: b}}"), "a")
    assert [(f.address, f.kv_pool) for f in await srv.resolve()] == [
        ("127.0.0.2:8001", "b"), ("127.0.0.3:8001", "b")]
    await dnsmasq.set({"engines.test": ["127.0.0.3"]})
    assert [f.address for f in await plain.resolve()] == ["127.0.0.3:8000"]
    gone = DnsResolver(_source(f"{{name: nothing.test, port: 8000, {server}}}"), "kv-a")
    assert await gone.resolve() == ()  # NXDOMAIN: an answer, no engines


async def test_a_server_that_does_not_answer_is_a_failure(dnsmasq: Dnsmasq) -> None:
    resolver = DnsResolver(_source(f"{{name: engines.test, port: 8000, every: 300ms, "
                                   f"server: '{dnsmasq.server}'}}"), "kv-a")
    dnsmasq.pause()
    try:
        with pytest.raises(DnsFailure, match=r"engines\.test"):
            await resolver.resolve()
    finally:
        dnsmasq.resume()
    assert await resolver.resolve() == ()  # answering again: the name has no records
