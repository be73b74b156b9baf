"""Every etcd failure, classified once, so each caller can handle its kind and name it.

The client turns every gRPC error into one of these; callers catch `EtcdError` (or a subclass
for a kind they treat differently) and log, count and show `error.kind`.
"""

from __future__ import annotations

from enum import StrEnum

import grpc


class EtcdErrorKind(StrEnum):
    UNAVAILABLE = "unavailable"  # no etcd member answered (down, no leader, connection lost)
    DEADLINE = "deadline"  # no answer within the call's deadline
    NO_SPACE = "no_space"  # the NOSPACE alarm: the quota is full, writes refused until disarmed
    AUTH = "auth"  # authentication or permission refused
    TOO_LARGE = "too_large"  # a request or reply over a size limit
    OTHER = "other"


class EtcdError(Exception):
    """An etcd call failed; `kind` says how, `operation` which call."""

    kind = EtcdErrorKind.OTHER

    def __init__(self, detail: str, *, operation: str = "", endpoint: str = "") -> None:
        self.detail = detail
        self.operation = operation
        self.endpoint = endpoint
        where = " ".join(part for part in (endpoint, operation) if part)
        super().__init__(f"etcd {where}: {self.kind}: {detail}" if where
                         else f"etcd: {self.kind}: {detail}")


class EtcdUnavailable(EtcdError):
    """etcd could not be reached or did not answer in time: retry, possibly elsewhere."""

    kind = EtcdErrorKind.UNAVAILABLE


class EtcdDeadline(EtcdUnavailable):
    kind = EtcdErrorKind.DEADLINE


class EtcdNoSpace(EtcdError):
    """The NOSPACE alarm is raised: reads and deletes work, writes fail until an operator
    compacts, defragments and disarms it (docs/operating.md, etcd out of space)."""

    kind = EtcdErrorKind.NO_SPACE


class EtcdAuthError(EtcdError):
    kind = EtcdErrorKind.AUTH


class EtcdTooLarge(EtcdError):
    kind = EtcdErrorKind.TOO_LARGE


class EtcdLeaseNotFound(EtcdError):
    """The lease a write refers to has expired (handled by granting a new one)."""

    kind = EtcdErrorKind.OTHER


class EtcdFenced(EtcdError):
    """A leader's write refused: its election key is no longer on its lease (a leader took over
    meanwhile). Nothing was written."""

    kind = EtcdErrorKind.OTHER


class EtcdCompacted(EtcdError):
    """A read at a revision etcd has compacted away (a paged listing outlived the history it
    started on): read again from now."""

    kind = EtcdErrorKind.OTHER


_BY_KIND: dict[EtcdErrorKind, type[EtcdError]] = {
    EtcdErrorKind.UNAVAILABLE: EtcdUnavailable,
    EtcdErrorKind.DEADLINE: EtcdDeadline,
    EtcdErrorKind.NO_SPACE: EtcdNoSpace,
    EtcdErrorKind.AUTH: EtcdAuthError,
    EtcdErrorKind.TOO_LARGE: EtcdTooLarge,
    EtcdErrorKind.OTHER: EtcdError,
}

# etcd's own messages (server/etcdserver/api/v3rpc/rpctypes), matched where the gRPC code alone
# is ambiguous: RESOURCE_EXHAUSTED is both NOSPACE and an oversized message, INVALID_ARGUMENT
# both a bad password and a too-large request.
_AUTH_MESSAGES = (
    "user name is empty", "authentication failed", "invalid auth token", "permission denied",
    "user name not found", "auth: ",
)


def classify(code: grpc.StatusCode | None, message: str) -> EtcdErrorKind:
    """The kind of an etcd failure from its gRPC status code and message."""
    text = message.lower()
    if "database space exceeded" in text or "nospace" in text:
        return EtcdErrorKind.NO_SPACE
    if "too large" in text or "larger than max" in text:
        return EtcdErrorKind.TOO_LARGE
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
        m in text for m in _AUTH_MESSAGES
    ):
        return EtcdErrorKind.AUTH
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EtcdErrorKind.DEADLINE
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or (
        # "too many requests": etcd is shedding load; retrying later is the answer
        code == grpc.StatusCode.RESOURCE_EXHAUSTED
    ):
        return EtcdErrorKind.UNAVAILABLE
    return EtcdErrorKind.OTHER


def from_rpc_error(exc: grpc.aio.AioRpcError, operation: str, endpoint: str) -> EtcdError:
    """The classified error for a failed gRPC call."""
    details = exc.details() or ""
    if exc.code() == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return EtcdLeaseNotFound(details, operation=operation, endpoint=endpoint)
    if "required revision has been compacted" in details:
        return EtcdCompacted(details, operation=operation, endpoint=endpoint)
    kind = classify(exc.code(), details)
    if "user name is empty" in details:  # a call without a token to an etcd that wants one
        details += " (etcd has authentication enabled: configure etcd.auth)"
    detail = f"{exc.code().name} {details}".strip()
    return _BY_KIND[kind](detail, operation=operation, endpoint=endpoint)


def from_message(message: str, operation: str, endpoint: str = "") -> EtcdError:
    """The classified error for a reason etcd gave in a reply (a watch's cancel reason)."""
    return _BY_KIND[classify(None, message)](message, operation=operation, endpoint=endpoint)
