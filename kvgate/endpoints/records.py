"""Endpoint records in etcd: `{prefix}endpoints/{pool}/{ip:port}` → {state, kv_pool, weight}."""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvgate.config.model import Config
from kvgate.etcd import EtcdClient

STATES = ("active", "draining", "failed")


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    pool: str
    address: str
    kv_pool: str
    weight: int = 1
    state: str = "active"

    def encode(self) -> bytes:
        return json.dumps(
            {"state": self.state, "kv_pool": self.kv_pool, "weight": self.weight}
        ).encode()

    @classmethod
    def decode(cls, pool: str, address: str, value: bytes) -> EndpointRecord:
        data = json.loads(value)
        state = str(data.get("state", "active"))
        if state not in STATES:
            raise ValueError(f"unknown endpoint state {state!r}")
        return cls(pool, address, str(data["kv_pool"]), int(data.get("weight", 1)), state)


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
    states: dict[bytes, str] = {}
    for kv in existing:
        try:
            states[kv.key] = json.loads(kv.value).get("state", "active")
        except ValueError:
            states[kv.key] = "active"
    wanted: set[bytes] = set()
    for pool in config.pools:
        for endpoint in pool.endpoints:
            key = record_key(prefix, pool.name, endpoint.key)
            wanted.add(key)
            state = states.get(key, "active")
            record = EndpointRecord(pool.name, endpoint.key, endpoint.kv_pool, endpoint.weight,
                                    state if state in STATES else "active")
            await client.put(key, record.encode())
    for key in states.keys() - wanted:
        await client.delete(key)
