"""The standard library's log records (gRPC's) as kvgate logs them: JSON, no raw traceback."""

from __future__ import annotations

import logging
import sys

from kvgate.observability.logs import GrpcUndecodable


def _record(msg: str) -> logging.LogRecord:
    try:
        b"\xff".decode()
    except UnicodeDecodeError:
        exc_info = sys.exc_info()
    return logging.LogRecord("grpc._cython.cygrpc", logging.ERROR, "grpc_string.pyx.pxi", 48,
                             msg, (), exc_info)


def test_grpc_undecodable_metadata_is_one_warning_per_interval_without_the_value() -> None:
    now = [0.0]
    undecodable = GrpcUndecodable(interval=10.0, clock=lambda: now[0])
    first = _record("Invalid encoding on b'\\xff\\xfe-secret'")
    assert undecodable.filter(first)
    assert first.getMessage() == "grpc_metadata_not_utf8" and first.exc_info is None
    assert first.levelname == "WARNING" and "secret" not in str(vars(first))
    for _ in range(3):
        now[0] += 1.0
        assert not undecodable.filter(_record("Invalid encoding on b'\\xff'"))
    now[0] += 10.0
    again = _record("Invalid encoding on b'\\xff'")
    assert undecodable.filter(again) and again.suppressed == 3  # type: ignore[attr-defined]
    other = _record("something else")
    assert undecodable.filter(other) and other.exc_info is not None  # untouched
