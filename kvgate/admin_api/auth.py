"""Bearer-token protection of the admin API, and where the tokens come from.

Two roles. The operator token may do everything, including what changes the fleet (drain,
undrain, fail, move): it is always required for those, on loopback too, where any local user
could otherwise drain the fleet. A read-only token may only read (status, lists, show). Reads
need no token on loopback unless a read-only token is configured; off loopback they need one of
the two. The standard health service stays open: probes (kubelet, load balancers) carry no
credentials and learn nothing from it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "KVGATE_ADMIN_TOKEN"  # the operator token
READ_TOKEN_ENV = "KVGATE_ADMIN_READ_TOKEN"  # the read-only token (control plane side)
HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIX = "/grpc.reflection.v1alpha.ServerReflection/"
_ADMIN = "/kvgate.admin.v1.Admin/"
# What a read-only token (or, on loopback, no token) may call. Everything else, and any method
# added later, needs the operator token.
READ_METHODS = frozenset(
    _ADMIN + name for name in ("ListEndpoints", "ListSessions", "ShowSession", "Status",
                               "WatchFleetLoad")
)


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


def is_read(method: str) -> bool:
    return method in READ_METHODS or method.startswith(REFLECTION_PREFIX)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through by its `authorization: Bearer <token>` and what it does: health
    checks always; reads with either token, or with none when `open_reads`; everything else
    with the operator token only. A wrong token is refused whatever the call."""

    def __init__(self, operator_token: str, read_token: str | None = None,
                 open_reads: bool = False, hint: str = "") -> None:
        if read_token is not None and read_token == operator_token:
            raise TokenError("the read-only admin token must differ from the operator token")
        # bytes: compare_digest on str rejects non-ASCII, which a client could send to crash it
        self._operator = f"Bearer {operator_token}".encode()
        self._read = None if read_token is None else f"Bearer {read_token}".encode()
        self._open_reads = open_reads and read_token is None
        self.hint = hint  # where an operator finds the token, for the refusal

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
        given = _bearer(details.invocation_metadata or ())
        operator = given is not None and hmac.compare_digest(given, self._operator)
        read = given is not None and self._read is not None and hmac.compare_digest(
            given, self._read)
        if given is not None and not (operator or read):
            return _deny(handler, grpc.StatusCode.UNAUTHENTICATED, "wrong admin token")
        if operator or (is_read(details.method) and (read or self._open_reads)):
            return handler
        action = details.method.rsplit("/", 1)[-1]
        if read:
            return _deny(handler, grpc.StatusCode.PERMISSION_DENIED,
                         f"{action} needs the operator token; this one is read-only")
        what = "reading" if is_read(details.method) else action
        return _deny(handler, grpc.StatusCode.UNAUTHENTICATED,
                     f"{what} needs {'an admin' if is_read(details.method) else 'the operator'} "
                     f"token (send authorization: Bearer <token>){self.hint}")


def _bearer(metadata: tuple[tuple[str, str | bytes], ...]) -> bytes | None:
    for key, value in metadata:
        if key == "authorization":
            return value if isinstance(value, bytes) else value.encode()
    return None


def _deny(
    handler: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same streaming kind as `handler` that only aborts with `code`."""

    async def deny(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, message)

    # Deserializers stay unset: the request is never read, so it is never parsed.
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)
