"""Which endpoints each pool has and in which state, as PoolViews for placement.

Membership comes from etcd's endpoint records when a pool has any (the control plane, or
`kvgate up`, writes them) and from the YAML otherwise, so ext_proc also works on its own.
A pool's PoolView holds the engines sessions may bind to (role `both` or `decode`); its prefill
engines (role `prefill`) are kept apart (`prefillers`), so placement never binds a session there.
"""

from __future__ import annotations

import structlog

from kvgate.config.model import Config
from kvgate.contract.states import EndpointState
from kvgate.endpoints.records import EndpointRecord
from kvgate.etcd import KeyValue
from kvgate.etcd.client import WatchEvent
from kvgate.placement.view import Member, PoolView

log = structlog.get_logger("kvgate.endpoints")


class EndpointDirectory:
    def __init__(self, config: Config) -> None:
        self._prefix = f"{config.etcd.prefix}endpoints/".encode()
        self._records: dict[str, dict[str, EndpointRecord]] = {}
        self._views: dict[str, PoolView] = {}
        self._prefillers: dict[str, tuple[Member, ...]] = {}
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """A reloaded config: its pools become the fallback membership."""
        self._configured = {
            pool.name: tuple(Member(ep.key, ep.kv_pool, ep.weight) for ep in pool.endpoints
                             if ep.role.decodes)
            for pool in config.pools
        }
        self._configured_prefill = {
            pool.name: tuple(Member(ep.key, ep.kv_pool, ep.weight) for ep in pool.endpoints
                             if not ep.role.decodes)
            for pool in config.pools
        }
        self._views.clear()
        self._prefillers.clear()

    @property
    def prefix(self) -> bytes:
        return self._prefix

    def pools(self) -> list[str]:
        return sorted(self._configured.keys() | self._records.keys())

    def view(self, pool: str) -> PoolView:
        view = self._views.get(pool)
        if view is None:
            members = self._members(pool, decoding=True)
            view = self._views[pool] = PoolView(pool, members)
        return view

    def prefillers(self, pool: str) -> tuple[Member, ...]:
        """The pool's active prefill engines (role `prefill`), in YAML order; () when it has
        none: a colocated pool."""
        found = self._prefillers.get(pool)
        if found is None:
            found = self._prefillers[pool] = tuple(
                m for m in self._members(pool, decoding=False) if m.state == EndpointState.ACTIVE)
        return found

    def _members(self, pool: str, *, decoding: bool) -> tuple[Member, ...]:
        records = self._records.get(pool)
        configured = self._configured if decoding else self._configured_prefill
        if not records:
            return configured.get(pool, ())
        return tuple(
            Member(r.address, r.kv_pool, r.weight, r.state)
            for r in sorted(records.values(), key=lambda r: _order(configured, r))
            if r.role.decodes == decoding
        )

    def active_addresses(self) -> list[str]:
        """Every active endpoint of every pool, once each, sorted: the engines whose load the
        gate reads."""
        return sorted({m.address for pool in self.pools()
                       for m in (*self.view(pool).active, *self.prefillers(pool))})

    def records(self, pool: str) -> list[EndpointRecord]:
        """The pool's records as etcd holds them (none: the pool runs on its YAML alone)."""
        return list(self._records.get(pool, {}).values())

    def record(self, pool: str, address: str) -> EndpointRecord | None:
        return self._records.get(pool, {}).get(address)

    def states(self) -> dict[str, dict[str, EndpointState]]:
        """pool → address → state, for every pool (configured endpoints default to active)."""
        return {pool: {m.address: m.state
                       for m in (*self.view(pool).members, *self._members(pool, decoding=False))}
                for pool in self.pools()}

    def set_record(self, record: EndpointRecord) -> None:
        self._records.setdefault(record.pool, {})[record.address] = record
        self._views.pop(record.pool, None)
        self._prefillers.pop(record.pool, None)

    # -- mirror handler (etcd `endpoints/` prefix) ----------------------------------------

    def reset(self, kvs: list[KeyValue]) -> None:
        self._records.clear()
        self._views.clear()
        self._prefillers.clear()
        for kv in kvs:
            self._apply_kv(kv)

    def apply(self, event: WatchEvent) -> None:
        if event.deleted:
            parsed = self._parse_key(event.kv.key)
            if parsed is not None:
                pool, address = parsed
                self._records.get(pool, {}).pop(address, None)
                self._views.pop(pool, None)
                self._prefillers.pop(pool, None)
        else:
            self._apply_kv(event.kv)

    def _apply_kv(self, kv: KeyValue) -> None:
        parsed = self._parse_key(kv.key)
        if parsed is None:
            return
        pool, address = parsed
        try:
            record = EndpointRecord.decode(pool, address, kv.value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("endpoint_record_unreadable", key=kv.key.decode(errors="replace"),
                        error=str(exc))
            return
        previous = self._records.get(pool, {}).get(address)
        if previous is None or previous.state != record.state:
            log.info("endpoint_state", pool=pool, endpoint=address, state=record.state)
        self.set_record(record)

    def _parse_key(self, key: bytes) -> tuple[str, str] | None:
        if not key.startswith(self._prefix):
            return None
        pool, _, address = key[len(self._prefix):].decode(errors="replace").partition("/")
        return (pool, address) if pool and address else None


def _order(configured: dict[str, tuple[Member, ...]], record: EndpointRecord) -> tuple[int, str]:
    """YAML order first (Envoy's host order, which the ring's weighting depends on)."""
    addresses = [m.address for m in configured.get(record.pool, ())]
    index = addresses.index(record.address) if record.address in addresses else len(addresses)
    return index, record.address
