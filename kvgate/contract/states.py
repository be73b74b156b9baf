"""Endpoint states, as etcd's endpoint records, ext_proc, the control plane, the admin API and
the simulator name them. String-valued: the records' JSON and the API's fields hold these words."""

from __future__ import annotations

from enum import StrEnum


class EndpointState(StrEnum):
    ACTIVE = "active"  # takes new sessions
    DRAINING = "draining"  # keeps its sessions (until a deadline), takes no new ones
    FAILED = "failed"  # its sessions move now; Envoy is told it is unhealthy


class MoveReason(StrEnum):
    """Why a bound session moved to another endpoint (`kvgate_ext_proc_rebinds_total{reason}`,
    `kvgate sessions show`)."""

    FAILED = "failed"  # its endpoint failed
    DRAINED = "drained"  # its endpoint was drained past its deadline, or left the pool
    LOAD = "load"  # a sibling in its DDR pool would answer sooner (the load gate)
    # Its context had left its engine's HBM and a DDR-pool sibling evicts slower (the load
    # gate's re-homing, from the engines' KV events)
    EVICTED = "evicted"
    MANUAL = "manual"  # an operator's `kvgate sessions move`


class Role(StrEnum):
    """What an engine does in a prefill/decode-disaggregated pool (`pools[].endpoints[].role`,
    `kvgate register --role`, `kvgate emulate --roles`). Defined once, here: config, endpoint
    records, discovery, the admin API and the emulator read these words."""

    BOTH = "both"  # colocated: prefills and decodes its own requests (the default)
    PREFILL = "prefill"  # prefills only; its KV is pulled by a decode engine (kv_transfer_params)
    DECODE = "decode"  # decodes sessions; prefills a turn itself when no prefill engine does

    @property
    def decodes(self) -> bool:
        """Sessions may be bound to it (it answers the client)."""
        return self is not Role.PREFILL
