"""A real DNS server for discovery tests: dnsmasq (Debian's dnsmasq-base) on a loopback port,
answering for `*.test` from a hosts file the test rewrites (SIGHUP re-reads it), and for the
SRV names it is given. Nothing is forwarded: a name it does not hold is NXDOMAIN.

dnsmasq cannot take port 0, so its port comes from tests.support.ports (a TCP check; dnsmasq
binds UDP and TCP on it and fails to start, visibly, if either is taken)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import dns.asyncresolver
import dns.exception
import dns.resolver

from kvgate.runtime.children.child import Child
from tests.support.polling import eventually
from tests.support.ports import free_port

DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
DOMAIN = "test"


def available() -> bool:
    return os.access(DNSMASQ, os.X_OK)


class Dnsmasq:
    def __init__(self, workdir: Path, srv: Iterable[str] = ()) -> None:
        """`srv`: dnsmasq `--srv-host` values (`_http._tcp.engines.test,target.test,8000`)."""
        self.workdir = workdir
        self.hosts = workdir / "dns-hosts"
        self.hosts.write_text("")
        self.port = free_port()
        self.srv = tuple(srv)
        self.child: Child | None = None

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        argv = [DNSMASQ, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
                "--no-hosts", f"--addn-hosts={self.hosts}", f"--port={self.port}",
                "--listen-address=127.0.0.1", "--bind-interfaces", f"--local=/{DOMAIN}/",
                "--pid-file=", "--local-ttl=0", "--log-facility=-",
                *(f"--srv-host={s}" for s in self.srv)]
        if os.geteuid() == 0:
            argv.append("--user=root")  # else it becomes nobody, who cannot read tmp_path
        self.child = Child("dnsmasq", argv, self.workdir / "dnsmasq.log")
        await self.child.start()
        await eventually(self._answers, until=lambda ok: ok,
                         what=f"dnsmasq answering on {self.server}")

    async def _answers(self) -> bool:
        assert self.child is not None
        if not self.child.running:
            raise AssertionError(f"dnsmasq exited:\n{self.child.tail()}")
        try:
            await self.resolve(f"nothing.{DOMAIN}")
        except dns.exception.DNSException:
            return False
        return True

    async def resolve(self, name: str) -> list[str]:
        """The A records it gives now ([] for NXDOMAIN)."""
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = ["127.0.0.1"], self.port, 1.0
        try:
            return sorted(r.address for r in await resolver.resolve(name, "A"))
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []

    async def set(self, records: dict[str, list[str]]) -> float:
        """Makes `name → IPs` its records (names under `.test`), and waits until it says so;
        returns when (monotonic) it was told to re-read them."""
        lines = [f"{ip} {name}" for name, ips in records.items() for ip in ips]
        self.hosts.write_text("".join(f"{line}\n" for line in lines))
        assert self.child is not None and self.child.pid is not None
        os.kill(self.child.pid, signal.SIGHUP)
        told = time.monotonic()
        for name, ips in records.items():
            wanted = sorted(ips)
            await eventually(partial(self.resolve, name), until=wanted.__eq__,
                             what=f"dnsmasq to give {name} as {ips}")
        return told

    def pause(self) -> None:
        """Stops answering (SIGSTOP): queries time out, as with a server that is away."""
        assert self.child is not None and self.child.pid is not None
        os.kill(self.child.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.child is not None and self.child.pid is not None
        os.kill(self.child.pid, signal.SIGCONT)

    async def stop(self) -> None:
        if self.child is not None:
            self.resume()
            await self.child.stop()
            await asyncio.sleep(0)
