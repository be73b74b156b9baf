"""`kvgate register`: keeps one engine's lease-bound registration in etcd while it runs (a
sidecar in the engine's pod). The pool's `discover: {etcd: {}}` source adds the engine within
about a second; when this stops (SIGTERM, Ctrl-C) the lease is revoked and the engine is
drained; when it dies, the lease expires after `--ttl` with the same effect.

    kvgate register --pool coder --engine http://10.0.0.7:8000 --kv-pool memcache-a --ttl 10s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import sys
from collections.abc import Callable

from kvgate.config import Config
from kvgate.config.fields import Fields
from kvgate.config.flags import etcd_flag, flags_refused, load_or_report
from kvgate.config.sections.names import ROLE_KIND
from kvgate.config.sections.names import name as pool_name
from kvgate.discovery.registrations import Registration, registration_key
from kvgate.etcd import EtcdClient, EtcdError
from kvgate.etcd.security import EtcdSecurityError, etcd_security

DEFAULT_ETCD = "127.0.0.1:2379"
DEFAULT_PREFIX = "/kvgate/v1/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", required=True, help="the pool the engine serves")
    parser.add_argument("--engine", required=True, help="its address, http://ip:port or ip:port")
    parser.add_argument("--kv-pool", help="the DDR KV pool it shares (default: the pool's "
                        "discover.etcd.kv_pool, else the pool's kv_pool)")
    parser.add_argument("--role", help="both, prefill or decode (default: both)")
    parser.add_argument("--weight", type=int, help="its share of the pool's sessions (1..128)")
    parser.add_argument("--ttl", default="10s", help="the lease: an engine whose register "
                        "stops renewing is gone after this long (default 10s)")
    parser.add_argument("-c", "--config", help="kvgate.yaml: etcd.endpoints, prefix, tls, auth")
    parser.add_argument("--etcd", help=f"comma-separated etcd endpoints (default: the config's, "
                        f"else {DEFAULT_ETCD})")
    parser.add_argument("--prefix", help=f"etcd key prefix (default: the config's, else "
                        f"{DEFAULT_PREFIX})")


def _registration(args: argparse.Namespace, fields: Fields) -> Registration | None:
    pool = pool_name(fields, args.pool, ("--pool",))
    address = fields.host_port(args.engine, ("--engine",), require_ip=True)
    kv_pool = None if args.kv_pool is None else pool_name(fields, args.kv_pool, ("--kv-pool",))
    role = None if args.role is None else ROLE_KIND.read(fields, args.role, ("--role",))
    weight = None if args.weight is None else fields.integer(args.weight, ("--weight",), 1, 128)
    if pool is None or address is None or fields.problems:
        return None
    return Registration(pool, str(address), kv_pool, weight, role)


def run(args: argparse.Namespace) -> int:
    fields = Fields()
    registration = _registration(args, fields)
    ttl = fields.duration(args.ttl, ("--ttl",), 2.0, 3600.0)
    config = Config()
    if args.config:
        loaded = load_or_report(args.config, require_pools=False)
        if loaded is None:
            return 2
        config = loaded
    if flags_refused(fields) or registration is None or ttl is None:
        return 2
    endpoints = etcd_flag(args.etcd, config) or (DEFAULT_ETCD,)
    prefix = args.prefix or (config.etcd.prefix if args.config else DEFAULT_PREFIX)
    try:
        security = etcd_security(config.etcd)
    except EtcdSecurityError as exc:
        print(exc, file=sys.stderr)
        return 2
    client = EtcdClient(endpoints, security=security)
    return asyncio.run(_main(client, prefix, registration, math.ceil(ttl)))


async def _main(client: EtcdClient, prefix: str, registration: Registration, ttl: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await keep_registered(client, prefix, registration, ttl, stop, _say)
    finally:
        await client.close()
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


async def keep_registered(client: EtcdClient, prefix: str, registration: Registration,
                          ttl: int, stop: asyncio.Event, say: Callable[[str], None]) -> None:
    """Puts the record on a lease of `ttl` seconds and renews it every third of that until
    `stop`; a lost lease (etcd away longer than the TTL) is granted and written again. At the
    end the lease is revoked, so the engine leaves at once."""
    key = registration_key(prefix, registration.pool, registration.address)
    where = f"{registration.pool}/{registration.address}"
    lease = 0
    while not stop.is_set():
        try:
            lease = await client.grant_lease(ttl)
            await client.put(key, registration.encode(), lease)
            say(f"registered {where} (lease {lease:x}, ttl {ttl}s)")
            while not await _stopped(stop, ttl / 3):
                if await client.keep_alive_once(lease) <= 0:
                    say(f"lease {lease:x} expired; registering {where} again")
                    break
        except EtcdError as exc:
            say(f"etcd: {exc.kind}: {exc}; retrying")
            await _stopped(stop, 1.0)
    if lease:
        with contextlib.suppress(EtcdError):
            await client.revoke_lease(lease)
            say(f"unregistered {where}")


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
