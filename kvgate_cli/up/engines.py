"""The engines' health, checked once when `kvgate up` is ready: ready is not said of a gateway
whose engines do not answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from kvgate.config.model import Config, Endpoint, Pool


@dataclass(frozen=True, slots=True)
class Unhealthy:
    engine: str
    reason: str


async def unhealthy_engines(config: Config) -> list[Unhealthy]:
    """Each engine whose pool's health check (GET health.path within health.timeout) fails now,
    with why, in config order."""
    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(
            _check(http, pool, endpoint) for pool in config.pools for endpoint in pool.endpoints
        ))
    return [r for r in results if r is not None]


async def _check(http: aiohttp.ClientSession, pool: Pool, endpoint: Endpoint) -> Unhealthy | None:
    url = f"http://{endpoint.key}{pool.health.path}"
    try:
        timeout = aiohttp.ClientTimeout(total=pool.health.timeout)
        async with http.get(url, timeout=timeout, allow_redirects=False) as reply:
            if 200 <= reply.status < 300:
                return None
            return Unhealthy(endpoint.key, f"GET {pool.health.path}: HTTP {reply.status}")
    except TimeoutError:
        return Unhealthy(endpoint.key, f"GET {pool.health.path}: no answer within "
                         f"{pool.health.timeout:g}s")
    except aiohttp.ClientConnectorError as exc:
        return Unhealthy(endpoint.key, f"cannot connect ({exc.os_error.strerror or exc})")
    except (aiohttp.ClientError, OSError) as exc:
        return Unhealthy(endpoint.key, f"GET {pool.health.path}: {exc or type(exc).__name__}")
