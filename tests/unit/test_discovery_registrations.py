"""Registrations: their record, what a pool's `etcd` source makes of one, and `kvgate register`'s
flags."""

from __future__ import annotations

import pytest

from kvgate.config.sections.discover import EtcdSource
from kvgate.contract.states import Role
from kvgate.discovery.registrations import Registration
from kvgate_cli.main import main


def test_a_registration_round_trips_and_the_source_overrides_it() -> None:
    registration = Registration("coder", "10.0.0.7:8000", "kv-b", 2, Role.PREFILL)
    assert Registration.decode("coder", "10.0.0.7:8000", registration.encode()) == registration
    bare = Registration.decode("coder", "10.0.0.7:8000", b"{}")
    assert bare.found(EtcdSource(), "kv-a") == bare.found(EtcdSource(), "kv-a")
    found = bare.found(EtcdSource(), "kv-a")
    assert (found.kv_pool, found.weight, found.role) == ("kv-a", 1, Role.BOTH)
    found = registration.found(EtcdSource(), "kv-a")
    assert (found.kv_pool, found.weight, found.role) == ("kv-b", 2, Role.PREFILL)
    found = registration.found(EtcdSource("kv-c", 5, Role.DECODE), "kv-a")
    assert (found.kv_pool, found.weight, found.role) == ("kv-c", 5, Role.DECODE)


@pytest.mark.parametrize(("address", "value"), [
    ("engine.local:8000", b"{}"), ("10.0.0.7:0", b"{}"), ("10.0.0.7:8000", b"[]"),
    ("10.0.0.7:8000", b'{"role": "both-ways"}'),
])
def test_an_unreadable_registration_is_refused(address: str, value: bytes) -> None:
    with pytest.raises(ValueError):
        Registration.decode("coder", address, value)


def test_register_names_each_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["register", "--pool", "Coder", "--engine", "localhost:80", "--role", "x",
                 "--ttl", "1s", "--kv-pool", "B"])
    err = capsys.readouterr().err
    assert code == 2
    for flag in ("--pool", "--engine", "--role", "--ttl", "--kv-pool"):
        assert f"{flag}:" in err
