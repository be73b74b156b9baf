"""Endpoint records in etcd: `{prefix}endpoints/{pool}/{ip:port}`.

A record keeps what an operator decided (`admin`: active, draining or failed, with a drain
deadline) apart from what health checks observed (`healthy`); `state` is derived from both and is
all that ext_proc reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from kvgate.config.model import Config
from kvgate.contract.states import EndpointState
from kvgate.etcd import EtcdClient


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    pool: str
    address: str
    kv_pool: str
    weight: int = 1
    admin: EndpointState = EndpointState.ACTIVE  # the operator's word
    healthy: bool = True  # the health checks' word
    drain_deadline: float | None = None  # unix time; past it a draining endpoint's sessions move

    @property
    def state(self) -> EndpointState:
        if self.admin == EndpointState.FAILED or not self.healthy:
            return EndpointState.FAILED
        return self.admin

    def encode(self) -> bytes:
        return json.dumps({
            "state": self.state, "admin": self.admin, "healthy": self.healthy,
            "drain_deadline": self.drain_deadline, "kv_pool": self.kv_pool, "weight": self.weight,
        }).encode()

    @classmethod
    def decode(cls, pool: str, address: str, value: bytes) -> EndpointRecord:
        data = json.loads(value)
        state = str(data.get("state", EndpointState.ACTIVE))
        admin = str(data.get("admin", EndpointState.ACTIVE if state == EndpointState.FAILED
                             else state))
        try:
            EndpointState(state)
            operator = EndpointState(admin)
        except ValueError:
            raise ValueError(f"unknown endpoint state {state!r}/{admin!r}") from None
        healthy = bool(data.get("healthy", state != EndpointState.FAILED
                                or operator is EndpointState.FAILED))
        deadline = data.get("drain_deadline")
        return cls(pool, address, str(data["kv_pool"]), int(data.get("weight", 1)), operator,
                   healthy, None if deadline is None else float(deadline))


def endpoints_prefix(prefix: str) -> bytes:
    return f"{prefix}endpoints/".encode()


def record_key(prefix: str, pool: str, address: str) -> bytes:
    return endpoints_prefix(prefix) + f"{pool}/{address}".encode()


async def seed_from_config(client: EtcdClient, config: Config) -> None:
    """Make etcd's endpoint records match the YAML's membership, keeping each one's state.

    Stands in for the control plane: new endpoints start active, drained or failed ones stay so,
    and records of endpoints no longer configured are removed.
    """
    prefix = config.etcd.prefix
    existing, _ = await client.get_prefix(endpoints_prefix(prefix))
    current: dict[bytes, EndpointRecord | None] = {}
    for kv in existing:
        pool_name, _, address = kv.key[len(endpoints_prefix(prefix)):].decode().partition("/")
        try:
            current[kv.key] = EndpointRecord.decode(pool_name, address, kv.value)
        except (ValueError, KeyError, TypeError):
            current[kv.key] = None  # unreadable: rewritten from the YAML below
    wanted: set[bytes] = set()
    for pool in config.pools:
        for endpoint in pool.endpoints:
            key = record_key(prefix, pool.name, endpoint.key)
            wanted.add(key)
            old = current.get(key)
            record = EndpointRecord(pool.name, endpoint.key, endpoint.kv_pool, endpoint.weight)
            if old is not None:
                record = replace(record, admin=old.admin, healthy=old.healthy,
                                 drain_deadline=old.drain_deadline)
            if old != record:
                await client.put(key, record.encode())
    for key in current.keys() - wanted:
        await client.delete(key)
