"""Config → YAML in the documented shape: what `kvgate up` hands to the services it starts."""

from __future__ import annotations

from typing import Any

import yaml

from kvgate.config.model import Config, HostPort


def _socket(address: HostPort) -> dict[str, Any]:
    return {"address": address.host, "port": address.port}


def _seconds(value: float) -> str:
    return f"{round(value * 1000)}ms"


def _placement(config: Config) -> dict[str, Any]:
    gate, cost = config.placement.load_gate, config.placement.engine_cost
    return {
        "load_factor": config.placement.load_factor,
        "load_gate": {
            "enabled": gate.enabled, "min_saving_s": gate.min_saving_s,
            "min_saving_ratio": gate.min_saving_ratio, "cooldown_s": gate.cooldown_s,
            "candidates": gate.candidates, "refresh_s": gate.refresh_s,
            "max_load_age_s": gate.max_load_age_s, "bytes_per_token": gate.bytes_per_token,
        },
        "engine_cost": {
            "prefill_tokens_per_s": cost.prefill_tokens_per_s,
            "prefill_overhead_s": cost.prefill_overhead_s,
            "kv_bytes_per_token": cost.kv_bytes_per_token, "ddr_gbps": cost.ddr_gbps,
            "transfer_fixed_ms": cost.transfer_fixed_s * 1000,
        },
    }


def to_dict(config: Config) -> dict[str, Any]:
    data: dict[str, Any] = {
        "listener": _socket(config.listener),
        "envoy_admin": _socket(config.envoy_admin),
        "control_plane": {
            "xds": str(config.control_plane.xds), "admin": str(config.control_plane.admin),
        },
        "ext_proc": {
            "address": [str(a) for a in config.ext_proc.addresses],
            "metrics": str(config.ext_proc.metrics),
            "message_timeout": _seconds(config.ext_proc.message_timeout),
            "transport": config.ext_proc.transport,
            "max_pending_bindings": config.ext_proc.max_pending_bindings,
        },
        "etcd": {"prefix": config.etcd.prefix},
        "session": {
            "headers": list(config.session.headers),
            "idle_ttl": _seconds(config.session.idle_ttl),
            "body_fields": list(config.session.body_fields),
            "implicit": "on" if config.session.implicit else "off",
            "body_limit": config.session.body_limit,
            "max_bindings": config.session.max_bindings,
        },
        "placement": _placement(config),
        "pools": [
            {
                "name": pool.name,
                "kv_pool": pool.kv_pool,
                "endpoints": [
                    {"address": ep.key, "kv_pool": ep.kv_pool, "weight": ep.weight}
                    for ep in pool.endpoints
                ],
                "health": {
                    "path": pool.health.path,
                    "interval": _seconds(pool.health.interval),
                    "timeout": _seconds(pool.health.timeout),
                    "unhealthy_threshold": pool.health.unhealthy_threshold,
                    "healthy_threshold": pool.health.healthy_threshold,
                    "max_failed_fraction": pool.health.max_failed_fraction,
                },
            }
            for pool in config.pools
        ],
        "routes": [
            {
                "match": {
                    **({"path": r.match.path} if r.match.path is not None
                       else {"prefix": r.match.prefix}),
                    "headers": dict(r.match.headers),
                },
                "pool": r.pool,
                "timeout": _seconds(r.timeout),
            }
            for r in config.routes
        ],
    }
    if config.etcd.endpoints is not None:
        data["etcd"]["endpoints"] = [str(e) for e in config.etcd.endpoints]
    tls, auth = config.etcd.tls, config.etcd.auth
    if tls is not None:
        data["etcd"]["tls"] = {k: v for k, v in (("ca", tls.ca), ("cert", tls.cert),
                                                 ("key", tls.key)) if v is not None}
    if auth is not None:  # the password itself never: it stays in its file or the environment
        data["etcd"]["auth"] = {"username": auth.username, **(
            {"password_file": auth.password_file} if auth.password_file else {})}
    if config.upstream_header is not None:
        data["upstream_header"] = config.upstream_header
    return data


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
