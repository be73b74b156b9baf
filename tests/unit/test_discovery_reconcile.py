"""The reconciler: what each source's answer means for the pool's discovered engines."""

from __future__ import annotations

from dataclasses import replace

from kvgate.contract.states import Role
from kvgate.discovery.reconcile import Found, Reconciler, Resolution


def _found(*hosts: int, kv_pool: str = "a") -> tuple[Found, ...]:
    return tuple(Found(f"127.0.0.{h}:8000", kv_pool) for h in hosts)


def _reconciler(**kwargs: object) -> Reconciler:
    settings: dict[str, object] = {"misses": {"dns": 3, "etcd": 1}, "drain_s": 60.0,
                                   "max_fraction": 0.5}
    settings.update(kwargs)
    return Reconciler(**settings)  # type: ignore[arg-type]


def _dns(r: Reconciler, at: float, *hosts: int):  # type: ignore[no-untyped-def]
    return r.observe(Resolution("dns", _found(*hosts), at))


def _addresses(engines: object) -> list[str]:
    return [e.found.address for e in engines]  # type: ignore[attr-defined]


def test_a_new_engine_is_added_and_nothing_else_changes() -> None:
    r = _reconciler()
    assert _addresses(_dns(r, 0, 1, 2).added) == ["127.0.0.1:8000", "127.0.0.2:8000"]
    changes = _dns(r, 1, 1, 2, 3)
    assert _addresses(changes.added) == ["127.0.0.3:8000"]
    assert not (changes.leaving or changes.removed or changes.updated or changes.returned)
    assert not _dns(r, 2, 1, 2, 3)


def test_three_misses_in_a_row_drain_and_the_drain_ends_in_removal() -> None:
    r = _reconciler()
    _dns(r, 0, 1, 2, 3, 4)
    assert not _dns(r, 1, 1, 2, 3)
    assert not _dns(r, 2, 1, 2, 3)
    changes = _dns(r, 3, 1, 2, 3)
    assert _addresses(changes.leaving) == ["127.0.0.4:8000"]
    assert r.deadline(changes.leaving[0]) == 63.0
    assert not r.expire(62.9)
    assert _addresses(r.expire(63.0).removed) == ["127.0.0.4:8000"]
    assert "127.0.0.4:8000" not in r.engines


def test_a_record_missing_one_resolution_in_three_never_drains() -> None:
    r = _reconciler()
    for round_ in range(30):
        hosts = (1, 2) if round_ % 3 == 2 else (1, 2, 3)
        assert not _dns(r, round_, *hosts).leaving
    assert r.engines["127.0.0.3:8000"].leaving_since is None


def test_an_address_that_comes_back_is_the_same_engine() -> None:
    r = _reconciler(misses={"dns": 1})
    _dns(r, 0, 1, 2)
    leaving = _dns(r, 1, 1).leaving
    engine = leaving[0]
    changes = _dns(r, 2, 1, 2)
    assert changes.returned == (engine,) and not changes.added
    assert engine.leaving_since is None


def test_a_failing_source_changes_nothing_and_ages() -> None:
    r = _reconciler(misses={"dns": 1})
    _dns(r, 10, 1, 2)
    for at in range(11, 80):
        assert not r.observe(Resolution("dns", None, at, "timed out"))
    assert not r.expire(80)
    assert len(r.engines) == 2
    assert r.staleness("dns", 80) == 70
    assert r.sources["dns"].last_error == "timed out" and r.sources["dns"].failures == 69
    _dns(r, 81, 1, 2)
    assert r.sources["dns"].last_error == "" and r.staleness("dns", 81) == 0


def test_one_round_removes_no_more_than_the_bound() -> None:
    r = _reconciler(misses={"dns": 1})
    _dns(r, 0, 1, 2, 3, 4)
    changes = _dns(r, 1, 1)  # three gone at once; floor(4 × 0.5) = 2 may leave
    assert len(changes.leaving) == 2 and len(changes.held) == 1
    assert not _dns(r, 2, 1).leaving  # two leaving already: still the bound
    r.expire(61)  # their drains end; two engines left, one of which may leave
    assert _addresses(_dns(r, 62, 1).leaving) == list(changes.held)


def test_a_pool_of_one_keeps_its_engine() -> None:
    r = _reconciler(misses={"dns": 1})
    _dns(r, 0, 1)
    changes = _dns(r, 1)
    assert not changes.leaving and changes.held == ("127.0.0.1:8000",)


def test_static_endpoints_are_the_files() -> None:
    r = _reconciler(static=frozenset({"127.0.0.1:8000"}))
    assert _addresses(_dns(r, 0, 1, 2).added) == ["127.0.0.2:8000"]


def test_an_engine_two_sources_name_stays_while_either_does() -> None:
    r = _reconciler(max_fraction=1.0)
    _dns(r, 0, 1)
    r.observe(Resolution("etcd", _found(1), 0))
    assert not r.observe(Resolution("etcd", (), 1)).leaving  # its lease is gone, DNS has it
    for at in (2, 3):
        assert not _dns(r, at)
    assert _addresses(_dns(r, 4).leaving) == ["127.0.0.1:8000"]


def test_a_lost_registration_leaves_at_once() -> None:
    r = _reconciler(max_fraction=1.0)
    r.observe(Resolution("etcd", _found(1, 2), 0))
    assert _addresses(r.observe(Resolution("etcd", _found(1), 1)).leaving) == [
        "127.0.0.2:8000"]


def test_attributes_follow_the_source() -> None:
    r = _reconciler()
    _dns(r, 0, 1)
    changed = Found("127.0.0.1:8000", "b", 2, Role.DECODE)
    changes = r.observe(Resolution("dns", (changed,), 1))
    assert changes.updated and changes.updated[0].found == changed


def test_records_follow_the_reconciler_keeping_the_operators_word() -> None:
    from control_plane.discovery.records import follow, wanted
    from kvgate.contract.states import EndpointState

    r = _reconciler(misses={"dns": 1})
    _dns(r, 100, 1, 2)
    engine = r.engines["127.0.0.2:8000"]
    record = wanted(engine, None, "coder")
    assert (record.source, record.admin, record.discovered) == ("dns", EndpointState.ACTIVE, True)
    _dns(r, 101, 1)
    drained = follow(record, engine, r.deadline(engine))
    assert (drained.admin, drained.drain_deadline, drained.left_at) == (
        EndpointState.DRAINING, 161.0, 101)
    failed = follow(replace(record, admin=EndpointState.FAILED), engine, r.deadline(engine))
    assert failed.admin is EndpointState.FAILED and failed.left_at == 101  # the operator's word
    _dns(r, 102, 1, 2)
    back = follow(drained, engine, r.deadline(engine))
    assert (back.admin, back.drain_deadline, back.left_at) == (EndpointState.ACTIVE, None, None)


def test_a_discovered_engines_role_reaches_its_record() -> None:
    from control_plane.discovery.records import follow, wanted
    from kvgate.endpoints import EndpointRecord

    r = _reconciler()
    prefill = Found("127.0.0.1:8000", "a", 1, Role.PREFILL)
    r.observe(Resolution("dns", (prefill,), 0))
    engine = r.engines[prefill.address]
    record = wanted(engine, None, "coder")
    assert record.role is Role.PREFILL
    assert EndpointRecord.decode("coder", prefill.address, record.encode()).role is Role.PREFILL
    # a source that now calls it a decode engine: the record follows
    r.observe(Resolution("dns", (replace(prefill, role=Role.DECODE),), 1))
    assert follow(record, r.engines[prefill.address], None).role is Role.DECODE
