"""etcd's own health as kvgate sees it: its alarms (NOSPACE: the quota is full, every write is
refused until an operator frees space and disarms it) and its database size against the quota,
polled every few seconds, exported as metrics and logged when they change."""

from __future__ import annotations

import asyncio

import structlog
from prometheus_client import CollectorRegistry, Gauge

from kvgate.etcd.client import EtcdClient
from kvgate.etcd.errors import EtcdError

log = structlog.get_logger("kvgate.etcd")

KNOWN_ALARMS = ("NOSPACE", "CORRUPT")


class EtcdAlarmWatch:
    def __init__(
        self, client: EtcdClient, service: str, registry: CollectorRegistry,
        interval: float = 5.0,
    ) -> None:
        self._client = client
        self._service = service
        self._interval = interval
        self.alarms: list[str] = []
        self._alarm = Gauge("kvgate_etcd_alarm", "1 while etcd raises this alarm (NOSPACE: "
                            "writes refused until disarmed)", ["service", "alarm"],
                            registry=registry)
        for alarm in KNOWN_ALARMS:
            self._alarm.labels(service, alarm).set(0)
        self._db = Gauge("kvgate_etcd_db_bytes", "etcd's database file (its quota counts this)",
                         ["service"], registry=registry)
        self._in_use = Gauge("kvgate_etcd_db_in_use_bytes", "of etcd's database, the part in "
                             "use (the rest is returned by a defragmentation)", ["service"],
                             registry=registry)

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._interval)

    async def check(self) -> None:
        try:
            alarms = await self._client.alarms()
            size, in_use = await self._client.db_size()
        except EtcdError:
            return  # counted and shown as an etcd error by the client already
        self._db.labels(self._service).set(size)
        self._in_use.labels(self._service).set(in_use)
        for alarm in sorted(set(alarms) - set(self.alarms)):
            log.error("etcd_alarm", alarm=alarm, db_bytes=size, db_in_use_bytes=in_use,
                      effect="etcd refuses every write until the alarm is disarmed" if alarm ==
                      "NOSPACE" else "see etcd's documentation",
                      fix="docs/operating.md: etcd out of space (compact, defrag, disarm)")
        for alarm in sorted(set(self.alarms) - set(alarms)):
            log.info("etcd_alarm_cleared", alarm=alarm)
        for alarm in set(alarms) | set(self.alarms) | set(KNOWN_ALARMS):
            self._alarm.labels(self._service, alarm).set(1 if alarm in alarms else 0)
        self.alarms = alarms
