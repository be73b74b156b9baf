"""One classification of etcd failures, from etcd's own status codes and messages."""

from __future__ import annotations

import grpc
import pytest

from kvgate.etcd.errors import (
    EtcdAuthError,
    EtcdDeadline,
    EtcdError,
    EtcdErrorKind,
    EtcdNoSpace,
    EtcdTooLarge,
    EtcdUnavailable,
    classify,
    from_message,
)

Code = grpc.StatusCode


@pytest.mark.parametrize(("code", "message", "kind"), [
    (Code.UNAVAILABLE, "connection refused", EtcdErrorKind.UNAVAILABLE),
    (Code.UNAVAILABLE, "etcdserver: leader changed", EtcdErrorKind.UNAVAILABLE),
    (Code.DEADLINE_EXCEEDED, "Deadline Exceeded", EtcdErrorKind.DEADLINE),
    (Code.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded",
     EtcdErrorKind.NO_SPACE),
    (Code.RESOURCE_EXHAUSTED, "Received message larger than max (5005660 vs. 4194304)",
     EtcdErrorKind.TOO_LARGE),
    (Code.INVALID_ARGUMENT, "etcdserver: request is too large", EtcdErrorKind.TOO_LARGE),
    (Code.RESOURCE_EXHAUSTED, "etcdserver: too many requests", EtcdErrorKind.UNAVAILABLE),
    (Code.INVALID_ARGUMENT, "etcdserver: user name is empty", EtcdErrorKind.AUTH),
    (Code.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password",
     EtcdErrorKind.AUTH),
    (Code.PERMISSION_DENIED, "etcdserver: permission denied", EtcdErrorKind.AUTH),
    (Code.UNAUTHENTICATED, "etcdserver: invalid auth token", EtcdErrorKind.AUTH),
    (Code.FAILED_PRECONDITION, "etcdserver: something new", EtcdErrorKind.OTHER),
    (Code.INTERNAL, "", EtcdErrorKind.OTHER),
])
def test_classify(code: grpc.StatusCode, message: str, kind: EtcdErrorKind) -> None:
    assert classify(code, message) == kind


def test_each_kind_is_its_own_exception_and_the_transient_ones_share_a_base() -> None:
    assert issubclass(EtcdDeadline, EtcdUnavailable)  # callers retry both the same way
    for error_type in (EtcdUnavailable, EtcdNoSpace, EtcdAuthError, EtcdTooLarge):
        assert issubclass(error_type, EtcdError)
    assert not issubclass(EtcdNoSpace, EtcdUnavailable)
    error = EtcdNoSpace("etcdserver: mvcc: database space exceeded", operation="Txn",
                        endpoint="127.0.0.1:2379")
    assert str(error) == ("etcd 127.0.0.1:2379 Txn: no_space: "
                          "etcdserver: mvcc: database space exceeded")


def test_a_watch_cancel_reason_is_classified_too() -> None:
    error = from_message("watch canceled: etcdserver: permission denied", "Watch")
    assert isinstance(error, EtcdAuthError) and error.kind == "auth"
