"""Endpoint records in etcd: `{prefix}endpoints/{pool}/{ip:port}`.

A record keeps what an operator decided (`admin`: active, draining or failed, with a drain
deadline) apart from what health checks observed (`healthy`); `state` is derived from both and is
all that ext_proc reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvgate.contract.states import EndpointState, Role

STATIC = "static"  # an endpoint the YAML lists (its record's source)


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    pool: str
    address: str
    kv_pool: str
    weight: int = 1
    admin: EndpointState = EndpointState.ACTIVE  # the operator's word
    healthy: bool = True  # the health checks' word
    drain_deadline: float | None = None  # unix time; past it a draining endpoint's sessions move
    role: Role = Role.BOTH  # prefill engines hold no sessions (kvgate.contract.states.Role)
    source: str = STATIC  # where the engine came from: the file, or a discovery source
    left_at: float | None = None  # unix time its source stopped naming it (drained for that)

    @property
    def state(self) -> EndpointState:
        if self.admin == EndpointState.FAILED or not self.healthy:
            return EndpointState.FAILED
        return self.admin

    @property
    def discovered(self) -> bool:
        return self.source != STATIC

    def encode(self) -> bytes:
        data: dict[str, object] = {
            "state": self.state, "admin": self.admin, "healthy": self.healthy,
            "drain_deadline": self.drain_deadline, "kv_pool": self.kv_pool, "weight": self.weight,
        }
        if self.role is not Role.BOTH:
            data["role"] = str(self.role)
        if self.discovered:  # a file's record keeps its old shape
            data |= {"source": self.source, "left_at": self.left_at}
        return json.dumps(data).encode()

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
        left = data.get("left_at")
        try:
            role = Role(str(data.get("role", Role.BOTH)))
        except ValueError:
            raise ValueError(f"unknown endpoint role {data.get('role')!r}") from None
        return cls(pool, address, str(data["kv_pool"]), int(data.get("weight", 1)), operator,
                   healthy, None if deadline is None else float(deadline), role=role,
                   source=str(data.get("source", STATIC)),
                   left_at=None if left is None else float(left))


def endpoints_prefix(prefix: str) -> bytes:
    return f"{prefix}endpoints/".encode()


def record_key(prefix: str, pool: str, address: str) -> bytes:
    return endpoints_prefix(prefix) + f"{pool}/{address}".encode()
