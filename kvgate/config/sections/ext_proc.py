"""`ext_proc:` the decision service Envoy asks, and how it reaches it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.config.address import HostPort
from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Address, Choice, Custom, Duration, Integer, key

MIN_MESSAGE_TIMEOUT = 0.05
EXT_PROC_TRANSPORTS = ("grpc", "http")
_DEFAULT_ADDRESSES = (HostPort("127.0.0.1", 9002),)


def _addresses(f: Fields, value: Any, path: Path) -> tuple[HostPort, ...] | None:
    items = value if isinstance(value, list) else [value]
    parsed = [f.host_port(v, (*path, i) if isinstance(value, list) else path, require_ip=True)
              for i, v in enumerate(items)]
    if not items:
        f.error(path, "must name at least one address")
    return tuple(a for a in parsed if a is not None) or None


def _dump_addresses(addresses: tuple[HostPort, ...]) -> list[str]:
    return [str(a) for a in addresses]


def _message_timeout(f: Fields, value: Any, path: Path) -> float | None:
    seconds = f.duration(value, path, 0.0, 10.0)
    if seconds is not None and seconds < MIN_MESSAGE_TIMEOUT:
        # A new session's etcd write gets half of it (ExtProc.etcd_write_deadline).
        f.error(path, f"must be at least {MIN_MESSAGE_TIMEOUT * 1000:g}ms, got {value!r}: a new "
                "session's etcd write gets half of it, and etcd (an fsync per write) would "
                "routinely miss a shorter deadline, leaving every new binding queued")
        return None
    return seconds


def _dump_seconds(value: float) -> Any:
    return Duration(0, 0).dump(value)


@dataclass(frozen=True, slots=True)
class ExtProc:
    addresses: tuple[HostPort, ...] = key(
        Custom(_addresses, "`ip:port`, or a list of them", _dump_addresses),
        "ext_proc replica(s): Envoy balances over all and retries the next when one is down; "
        "`kvgate ext-proc` listens on the first by default",
        default=_DEFAULT_ADDRESSES, name="address", default_doc="`127.0.0.1:9002`")
    metrics: HostPort = key(Address(), "ext_proc's `/metrics` and `/healthz`",
                            default=HostPort("127.0.0.1", 9003))
    message_timeout: float = key(
        Custom(_message_timeout, "duration, 50ms..10s", _dump_seconds),
        "how long Envoy waits for a decision before falling back to its ring (with `transport: "
        "http`, also the timeout of the HTTP request that asks). A new session's etcd write gets "
        "half of it, at most 100 ms (below 50 ms, etcd, an fsync per write, would routinely "
        "miss that and every new binding be queued), and one more try on the next etcd member "
        "within three quarters of it, at most 1 s", default=0.2, default_doc="`200ms`")
    transport: str = key(
        Choice(EXT_PROC_TRANSPORTS),
        "how Envoy's ext_proc filter reaches ext_proc: `grpc` (the ext_proc gRPC service, one "
        "stream per request) or `http` (the filter's `http_service`: each request's headers "
        "POSTed as JSON to ext_proc's plain HTTP/1.1 server; several times cheaper per "
        "decision, but work in progress in Envoy and outside its threat model). Same decision "
        "code, same answers", default="grpc")
    max_pending_bindings: int = key(
        Integer(1, 10_000_000),
        "bindings a replica queues while etcd takes no writes (degraded mode); past it a new "
        "session is routed on Envoy's ring without a binding", default=100_000)

    @property
    def etcd_write_deadline(self) -> float:
        """How long a request may wait for its new binding's etcd write before it is queued
        instead: half of Envoy's wait for the decision (the rest is for the gRPC round trip and
        the decision), at most 100 ms (a slower etcd is treated as away)."""
        return min(0.1, self.message_timeout / 2)

    @property
    def etcd_write_budget(self) -> float:
        """How long a request may wait for its binding's etcd write in all: a write that misses
        its deadline, or whose etcd member is gone, is tried once more on the next member
        within this (three quarters of Envoy's wait, at most 1 s) before it is queued."""
        return max(self.etcd_write_deadline, min(1.0, self.message_timeout * 0.75))
