"""The DNS source: a name's A/AAAA records are the engines (at the configured port), or an SRV
name's targets and ports. Asked of `server` when set, else of the system's resolver (dnspython's
asyncio resolver).

An authoritative "no such name" (NXDOMAIN) or "no records" is an answer: no engines. A timeout,
SERVFAIL or refusal is a failure: the source changes nothing (kvgate.discovery.reconcile)."""

from __future__ import annotations

from typing import Any

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

from kvgate.config.sections.discover import DnsSource, is_srv
from kvgate.discovery.reconcile import Found

SOURCE = "dns"


class DnsFailure(Exception):
    """The name could not be resolved now (not: it has no records)."""


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class DnsResolver:
    def __init__(self, source: DnsSource, pool_kv: str) -> None:
        self._source = source
        self._kv_pool = source.kv_pool or pool_kv
        if source.server is None:
            self._resolver = dns.asyncresolver.Resolver()
        else:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [source.server.host.strip("[]")]
            self._resolver.port = source.server.port
        # One resolution must end well before the next is due.
        self._resolver.lifetime = max(0.2, min(source.every, 5.0))
        self._resolver.cache = None  # every round asks the server: TTLs are the server's care

    async def resolve(self) -> tuple[Found, ...]:
        """The engines the name gives now; DnsFailure when the server cannot say."""
        name = self._source.name
        if is_srv(name):
            targets = [(str(r.target), r.port) for r in await self._query(name, "SRV")]
        else:
            assert self._source.port is not None  # the config requires it for A/AAAA
            targets = [(name, self._source.port)]
        addresses: set[str] = set()
        for target, port in targets:
            for kind in ("A", "AAAA"):
                addresses |= {_address(r.address, port) for r in await self._query(target, kind)}
        return tuple(Found(a, self._kv_pool, self._source.weight, self._source.role)
                     for a in sorted(addresses))

    async def _query(self, name: str, kind: str) -> list[Any]:  # SRV, A or AAAA rdata
        try:
            answer = await self._resolver.resolve(name, kind, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except (dns.exception.Timeout, dns.resolver.NoNameservers,
                dns.resolver.LifetimeTimeout) as exc:
            raise DnsFailure(f"{name} {kind}: {exc.__class__.__name__}: {exc}") from None
        except dns.exception.DNSException as exc:
            raise DnsFailure(f"{name} {kind}: {exc}") from None
        return list(answer)
