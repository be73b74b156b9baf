"""Structured JSON logs (structlog) to stderr, one object per line."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import structlog


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
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
