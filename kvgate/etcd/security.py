"""How kvgate reaches etcd: TLS channels (`etcd.tls`) and user authentication (`etcd.auth`).

Kept apart from the client's operations: `open_channel` is the one place a channel to etcd is
made. With a user, every call carries etcd's token in the `token` metadata. The token comes from
Auth.Authenticate(name, password); etcd forgets it after `--auth-token-ttl` of disuse (300 s by
default) or on a restart, and then answers UNAUTHENTICATED "invalid auth token": the call is
authenticated again and retried once, within its own deadline. A watch opened with a stale token
is cancelled with "permission denied"; the mirrors list again before they watch, which renews it.

The password lives in one private attribute and is never logged, printed or put in a repr.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from aetcd.rpc import rpc_pb2 as rpc
from aetcd.rpc import rpc_pb2_grpc as stubs

from kvgate.config.etcd_security import PASSWORD_ENV
from kvgate.config.model import Etcd
from kvgate.etcd.replies import AuthenticateReply

log = structlog.get_logger("kvgate.etcd")

AUTHENTICATE = "/etcdserverpb.Auth/Authenticate"
AUTHENTICATE_TIMEOUT = 5.0  # a call without its own deadline (a watch) waits this long for one
ChannelOptions = Sequence[tuple[str, Any]]


class EtcdSecurityError(Exception):
    """The TLS files or the password cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class _TlsMaterial:
    ca: bytes | None = field(repr=False)
    cert: bytes | None = field(repr=False)
    key: bytes | None = field(repr=False)


class EtcdSecurity:
    """TLS channel credentials and/or an etcd user, for every channel of one client."""

    def __init__(
        self, *, tls: _TlsMaterial | None = None, username: str | None = None,
        password: str | None = None,
    ) -> None:
        if (username is None) != (password is None):
            raise EtcdSecurityError("an etcd user needs both a name and a password")
        self._credentials = None if tls is None else grpc.ssl_channel_credentials(
            root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert)
        self.username = username
        self.tls = tls is not None
        self.client_certificate = tls is not None and tls.cert is not None
        self._tokens = None if username is None else _Tokens(username, password or "")

    def __repr__(self) -> str:
        return f"EtcdSecurity(tls={self.tls}, username={self.username!r})"

    def describe(self) -> dict[str, object]:
        """For logs: what is used, never a secret."""
        return {"etcd_tls": self.tls, "etcd_client_cert": self.client_certificate,
                "etcd_user": self.username}

    @property
    def authentications(self) -> int:
        """How many times a token was obtained (1 unless etcd forgot one)."""
        return 0 if self._tokens is None else self._tokens.obtained

    def open_channel(self, endpoint: str, options: ChannelOptions) -> grpc.aio.Channel:
        interceptors: list[grpc.aio.ClientInterceptor] = []
        holder: list[stubs.AuthStub] = []
        if self._tokens is not None:
            tokens = self._tokens
            interceptors = [_UnaryToken(tokens, holder), _StreamToken(tokens, holder)]
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(endpoint, options, interceptors=interceptors)
        else:
            channel = grpc.aio.secure_channel(endpoint, self._credentials, options,
                                              interceptors=interceptors)
        holder.append(stubs.AuthStub(channel))  # Authenticate goes over the same channel
        return channel


def open_channel(
    endpoint: str, options: ChannelOptions, security: EtcdSecurity | None
) -> grpc.aio.Channel:
    """A channel to one etcd endpoint: plaintext without `security`."""
    if security is None:
        return grpc.aio.insecure_channel(endpoint, options)
    return security.open_channel(endpoint, options)


def etcd_security(etcd: Etcd, environ: Mapping[str, str] = os.environ) -> EtcdSecurity | None:
    """The security `etcd.tls` and `etcd.auth` ask for (None: plaintext, no user). Reads the
    files and the password now, so a service refuses to start before any side effect."""
    if etcd.tls is None and etcd.auth is None:
        return None
    tls = None
    if etcd.tls is not None:
        tls = _TlsMaterial(_read(etcd.tls.ca, "etcd.tls.ca"), _read(etcd.tls.cert, "etcd.tls.cert"),
                           _read(etcd.tls.key, "etcd.tls.key"))
    username = password = None
    if etcd.auth is not None:
        username = etcd.auth.username
        password = _password(etcd.auth.password_file, environ, username)
    return EtcdSecurity(tls=tls, username=username, password=password)


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise EtcdSecurityError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


def _password(file: str | None, environ: Mapping[str, str], username: str) -> str:
    if file is not None:
        data = _read(file, "etcd.auth.password_file") or b""
        try:
            password = data.decode("utf-8").rstrip("\r\n")  # editors end files with a newline
        except UnicodeDecodeError:
            raise EtcdSecurityError(f"etcd.auth.password_file: {file} is not UTF-8") from None
        if not password:
            raise EtcdSecurityError(f"etcd.auth.password_file: {file} is empty")
        return password
    password = environ.get(PASSWORD_ENV, "")
    if not password:
        raise EtcdSecurityError(
            f"etcd.auth: no password for etcd user {username!r}: give etcd.auth.password_file "
            f"or set {PASSWORD_ENV}")
    return password


class _Tokens:
    """One user's token, shared by every channel of a client; obtained once even when many calls
    need it at the same moment."""

    def __init__(self, username: str, password: str) -> None:
        self.username = username
        self.__password = password
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._auth_disabled_logged = False
        self.obtained = 0

    def __repr__(self) -> str:
        return f"_Tokens(username={self.username!r})"

    async def get(self, stub: stubs.AuthStub, limit_s: float | None) -> str | None:
        if self._token is not None:
            return self._token
        async with self._lock:
            if self._token is None:
                self._token = await self._authenticate(stub, limit_s)
            return self._token or None

    def forget(self, token: str | None) -> None:
        """etcd refused `token`: the next call authenticates again (unless another did)."""
        if token is not None and self._token == token:
            self._token = None

    async def _authenticate(self, stub: stubs.AuthStub, limit_s: float | None) -> str:
        request = rpc.AuthenticateRequest(name=self.username, password=self.__password)
        try:
            reply: AuthenticateReply = await stub.Authenticate(
                request, timeout=limit_s or AUTHENTICATE_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            if "authentication is not enabled" in details:
                # The data is then open to anyone who reaches etcd: say so, once, and go on.
                if not self._auth_disabled_logged:
                    log.warning("etcd_auth_not_enabled", user=self.username,
                                hint="etcd accepts calls without credentials; enable its "
                                "authentication (etcdctl auth enable)")
                    self._auth_disabled_logged = True
                return ""  # no token: calls go without one
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                              grpc.StatusCode.PERMISSION_DENIED):
                raise _rewritten(exc, f"etcd refused the credentials for user "
                                 f"{self.username!r} ({details})") from None
            raise
        self.obtained += 1
        return reply.token


def _rewritten(exc: grpc.aio.AioRpcError, details: str) -> grpc.aio.AioRpcError:
    """The same failure with clearer words (the client classifies it by code and message)."""
    return grpc.aio.AioRpcError(exc.code(), exc.initial_metadata(), exc.trailing_metadata(),
                                details, exc.debug_error_string())


def _method(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


def _with_token(details: grpc.aio.ClientCallDetails, token: str | None,
                timeout: float | None) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    if token:
        metadata.add("token", token)
    return grpc.aio.ClientCallDetails(details.method, timeout, metadata, details.credentials,
                                      details.wait_for_ready)


class _UnaryToken(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the token; on "invalid auth token", authenticates again and retries once."""

    def __init__(self, tokens: _Tokens, stub: list[stubs.AuthStub]) -> None:
        self._tokens = tokens
        self._stub = stub

    async def intercept_unary_unary(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> Any:
        if _method(client_call_details) == AUTHENTICATE:
            return await continuation(client_call_details, request)
        loop = asyncio.get_running_loop()
        timeout = client_call_details.timeout
        deadline = None if timeout is None else loop.time() + timeout
        for attempt in (1, 2):
            token = await self._tokens.get(self._stub[0], _left(loop, deadline))
            call = await continuation(_with_token(client_call_details, token,
                                                  _left(loop, deadline)), request)
            try:
                return await call
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED and attempt == 1:
                    self._tokens.forget(token)
                    continue
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise _rewritten(exc, f"etcd user {self._tokens.username!r} may not do "
                                     f"this ({exc.details()}): grant its role readwrite on "
                                     "etcd.prefix") from None
                raise
        raise AssertionError("unreachable")


class _StreamToken(grpc.aio.StreamStreamClientInterceptor):
    """Adds the token to a stream (watch, lease keep-alive) when it opens. A stale one is
    renewed by the next unary call (a mirror lists before it watches again)."""

    def __init__(self, tokens: _Tokens, stub: list[stubs.AuthStub]) -> None:
        self._tokens = tokens
        self._stub = stub

    async def intercept_stream_stream(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any,
    ) -> AsyncIterator[Any] | Any:
        token = await self._tokens.get(self._stub[0], client_call_details.timeout)
        return await continuation(
            _with_token(client_call_details, token, client_call_details.timeout),
            request_iterator)


def _left(loop: asyncio.AbstractEventLoop, deadline: float | None) -> float | None:
    return None if deadline is None else max(0.001, deadline - loop.time())
