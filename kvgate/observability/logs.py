"""Structured JSON logs (structlog) to stderr, one object per line."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import structlog


def configure_logging(level: str = "info") -> None:
    """structlog's events, and the standard library's records (gRPC's, aiohttp's, asyncio's),
    as one JSON object per line: a traceback is the `exception` field, never raw lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    ))
    logging.basicConfig(handlers=[handler], level=level.upper(), force=True)
    logging.getLogger("grpc._cython.cygrpc").addFilter(GrpcUndecodable())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class Throttled:
    """Logs an event at most once per `interval` seconds per key, saying how many occurrences
    were not logged since: for events that can come thousands of times a second (floods)."""

    def __init__(
        self, logger: structlog.typing.FilteringBoundLogger, interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, event: str, key: str = "", **fields: object) -> bool:
        """Logs unless this event and key were logged less than `interval` ago; True if
        logged."""
        name = f"{event}/{key}"
        now = self._clock()
        last = self._last.get(name)
        if last is not None and now - last < self._interval:
            self._suppressed[name] = self._suppressed.get(name, 0) + 1
            return False
        self._last[name] = now
        self._log.warning(event, suppressed=self._suppressed.pop(name, 0), **fields)
        return True


class GrpcUndecodable(logging.Filter):
    """gRPC logs a traceback (`Invalid encoding on b'...'`) for every metadata value that is not
    UTF-8 — a session header with such bytes, which Envoy copies into the ext_proc stream's
    metadata — and then passes the value on as bytes, which ext_proc handles. One warning
    without the traceback instead, at most every `interval` seconds, saying how many were not
    logged since. The value itself is not logged (it may be a client's secret)."""

    def __init__(self, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last = float("-inf")
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Invalid encoding"):
            return True
        now = self._clock()
        if now - self._last < self._interval:
            self._suppressed += 1
            return False
        self._last = now
        record.msg, record.args = "grpc_metadata_not_utf8", ()
        record.detail = ("a gRPC metadata value (a session header?) is not UTF-8; passed on "
                         "as bytes")
        record.suppressed = self._suppressed
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self._suppressed = 0
        return True
