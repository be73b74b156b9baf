"""An in-process control plane against a real etcd, and ways to make its tasks fail on purpose."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from control_plane.service import ControlPlaneOptions, ControlPlaneService
from kvgate.config import Config, load_text
from kvgate.config.dump import to_dict
from tests.support.stack import gateway_config


def control_plane_config(endpoints: list[str], etcd: str, prefix: str) -> Config:
    return gateway_config(endpoints, etcd=[etcd], prefix=prefix)


def write_config(path: Path, config: Config) -> Path:
    path.write_text(yaml.safe_dump(to_dict(config)))
    return path


def with_endpoints(config: Config, endpoints: list[str | dict[str, Any]]) -> Config:
    """The same config with another endpoint list for its one pool."""
    data = to_dict(config)
    data["pools"][0]["endpoints"] = endpoints
    return load_text(yaml.safe_dump(data))


@asynccontextmanager
async def running_control_plane(
    config: Config, path: Path, identity: str = "cp-test", **options: Any
) -> AsyncIterator[ControlPlaneService]:
    """A control plane started from `config` (written at `path`, which it reloads), stopped at
    the end."""
    service = ControlPlaneService(config, ControlPlaneOptions(
        config_path=path, etcd=tuple(str(e) for e in config.etcd.endpoints or ()),
        admin=config.control_plane.admin,
        identity=identity, **options,
    ))
    try:
        await service.start()
        yield service
    finally:
        await service.stop(grace=0)


def restarts(registry: CollectorRegistry, service: str, task: str) -> float:
    value = registry.get_sample_value("kvgate_task_restarts_total",
                                      {"service": service, "task": task})
    return value or 0.0


def fail_once(
    monkeypatch: pytest.MonkeyPatch, target: object, name: str, error: BaseException,
    *, calls_failed: int = 1,
) -> Callable[[], int]:
    """Makes `target.name` raise `error` on its first call (its first `calls_failed`), then
    behave as before; returns a function counting the calls."""
    original = getattr(target, name)
    calls = 0

    if inspect.iscoroutinefunction(original):
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls <= calls_failed:
                raise error
            return await original(*args, **kwargs)
    else:
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            nonlocal calls
            calls += 1
            if calls <= calls_failed:
                raise error
            return original(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapper)
    return lambda: calls
