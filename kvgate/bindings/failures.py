"""Background etcd failures of the binding store, logged once per change of kind."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from kvgate.etcd import EtcdError

log = structlog.get_logger("kvgate.bindings")


class BackgroundFailures:
    """Each background task's latest etcd error, by log event: a retry every 0.5 s during an
    outage logs once, not a line per retry."""

    def __init__(self, pending: Callable[[], int] = lambda: 0) -> None:
        self._latest: dict[str, EtcdError] = {}
        self._pending = pending

    def failed(self, event: str, error: EtcdError) -> None:
        before = self._latest.get(event)
        if before is None or before.kind != error.kind:
            log.warning(event, kind=str(error.kind), error=str(error), pending=self._pending())
        self._latest[event] = error

    def ok(self, event: str) -> None:
        before = self._latest.pop(event, None)
        if before is not None:
            log.info("bindings_etcd_recovered", after=event, kind=str(before.kind))

    def forget(self, event: str) -> None:
        self._latest.pop(event, None)
