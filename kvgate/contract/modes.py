"""Routing modes: how the gateway spreads requests over the engines. Only the affinity modes are
kvgate; the others are the baselines users compare it with. One enum for everything that names a
mode: the xDS builders (`kvgate envoy-config --mode`), `kvgate bench --compare`, `kvgate simulate`
and `kvgate plan`."""

from __future__ import annotations

from enum import StrEnum


class RoutingMode(StrEnum):
    ROUND_ROBIN = "round_robin"  # the bank's old setup: any request to any engine
    RING_HASH = "ring_hash"  # plain Envoy ring_hash on the session header
    AFFINITY = "affinity"  # kvgate (ext_proc + bindings, ring_hash fallback), no DDR pool
    ROUND_ROBIN_DDR = "round_robin+ddr"  # Envoy round robin, engines sharing a DDR KV pool
    AFFINITY_DDR = "affinity+ddr"  # kvgate, engines sharing a DDR KV pool

    @property
    def ddr_pool(self) -> bool:
        """The engines share a DDR KV pool: a property of the fleet, not of Envoy's config."""
        return self in (RoutingMode.AFFINITY_DDR, RoutingMode.ROUND_ROBIN_DDR)

    @property
    def round_robin(self) -> bool:
        """Envoy's round robin routes (with or without a pool behind the engines)."""
        return self in (RoutingMode.ROUND_ROBIN, RoutingMode.ROUND_ROBIN_DDR)

    @property
    def uses_ext_proc(self) -> bool:
        """ext_proc picks the engine (with etcd and the control plane); else Envoy alone."""
        return self in (RoutingMode.AFFINITY, RoutingMode.AFFINITY_DDR)
