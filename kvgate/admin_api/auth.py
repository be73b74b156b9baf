"""Bearer-token protection of the admin API, and where the token comes from.

Off loopback anyone on the network could drain the fleet, so a token is mandatory there; on
loopback it is optional but enforced when given. The standard health service stays open: probes
(kubelet, load balancers) carry no credentials and learn nothing from it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "KVGATE_ADMIN_TOKEN"
HEALTH_PREFIX = "/grpc.health.v1.Health/"


class TokenError(Exception):
    """The token could not be read, or a listener needs one and has none."""


def load_token(env: str = TOKEN_ENV, file: str | None = None) -> str | None:
    """The admin token: from `file` when given (it wins over the environment), else from `env`.

    Surrounding whitespace is dropped (files end in a newline); empty means no token.
    """
    if file is not None:
        try:
            value = Path(file).read_text()
        except OSError as exc:
            raise TokenError(f"cannot read admin token file {file}: {exc.strerror}") from None
    else:
        value = os.environ.get(env, "")
    return value.strip() or None


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve anywhere


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects every call except health checks unless it carries `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        # bytes: compare_digest on str rejects non-ASCII, which a client could send to crash it
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler
        if self._authorized(details.invocation_metadata or ()):
            return handler
        return _deny(handler, "missing or wrong admin token (send authorization: Bearer <token>)")

    def _authorized(self, metadata: tuple[tuple[str, str | bytes], ...]) -> bool:
        for key, value in metadata:
            if key == "authorization":
                given = value if isinstance(value, bytes) else value.encode()
                return hmac.compare_digest(given, self._expected)
        return False


def _deny(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that only aborts: UNAUTHENTICATED."""

    async def deny(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    # Deserializers stay unset: the request is never read, so it is never parsed.
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)
