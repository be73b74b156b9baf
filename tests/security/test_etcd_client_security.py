"""The etcd client against a real etcd with client-certificate TLS, and one with authentication
enabled: every operation kvgate uses works; refused credentials are named as such."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvgate.config.model import Etcd, EtcdTls
from kvgate.etcd import EtcdAuthError, EtcdClient, EtcdErrorKind, EtcdUnavailable
from kvgate.etcd.security import etcd_security
from tests.support.secure_etcd import PASSWORD, USER, Pki, SecureEtcd, make_pki

MAKE_CERTS = Path(__file__).resolve().parents[2] / "deploy/tls/make-etcd-certs.sh"

PREFIX = b"/kvgate/t/"
TOKEN_TTL = 2


@pytest.fixture
async def tls_etcd(tmp_path: Path) -> AsyncIterator[SecureEtcd]:
    server = SecureEtcd(tmp_path / "tls", tls=True, auth=False)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def auth_etcd(tmp_path: Path) -> AsyncIterator[SecureEtcd]:
    # A 2 s token TTL, so a test can see a token expire and be renewed.
    server = SecureEtcd(tmp_path / "auth", tls=False, auth=True,
                        extra_args=("--auth-token-ttl", str(TOKEN_TTL)))
    await server.start()
    yield server
    await server.stop()


async def _exercise(client: EtcdClient) -> None:
    """What ext_proc and the control plane do: put, create-if-absent, compare-and-set, a lease
    and its refresh, a prefix read, a watch."""
    lease = await client.grant_lease(30)
    assert await client.keep_alive_once(lease) > 0
    created, _ = await client.create(PREFIX + b"bindings/a", b"1", lease)
    assert created
    revision = await client.put(PREFIX + b"endpoints/x", b"active")
    replaced, _ = await client.replace(PREFIX + b"endpoints/x", b"draining", revision)
    assert replaced
    kvs, at = await client.get_prefix(PREFIX)
    assert {kv.key for kv in kvs} == {PREFIX + b"bindings/a", PREFIX + b"endpoints/x"}
    watch = client.watch_prefix(PREFIX, at + 1)
    await client.put(PREFIX + b"endpoints/y", b"active")
    events: list = []
    while not events:  # the first reply only says the watch was created
        events, _ = await anext(watch)
    assert [e.kv.key for e in events] == [PREFIX + b"endpoints/y"]
    await watch.aclose()
    await client.revoke_lease(lease)


async def test_client_certificate_tls(tls_etcd: SecureEtcd, tmp_path: Path) -> None:
    client = tls_etcd.client()
    try:
        await _exercise(client)
    finally:
        await client.close()

    # Without a client certificate, or trusting another CA, etcd is not reached at all.
    assert tls_etcd.pki is not None
    no_cert = EtcdClient([tls_etcd.endpoint], timeout=1, security=etcd_security(
        Etcd(tls=EtcdTls(ca=str(tls_etcd.pki.ca)))))
    stranger = make_pki(tmp_path / "stranger")
    wrong_ca = EtcdClient([tls_etcd.endpoint], timeout=1, security=etcd_security(
        Etcd(tls=EtcdTls(ca=str(stranger.ca), cert=str(tls_etcd.pki.client_cert),
                         key=str(tls_etcd.pki.client_key)))))
    plaintext = EtcdClient([tls_etcd.endpoint], timeout=1)
    for refused in (no_cert, wrong_ca, plaintext):
        try:
            with pytest.raises(EtcdUnavailable):
                await refused.get(PREFIX)
        finally:
            await refused.close()


async def test_the_deploy_certificate_script_makes_what_etcd_and_kvgate_accept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "etcd-tls"
    made = await asyncio.create_subprocess_exec(
        "sh", str(MAKE_CERTS), str(out), "etcd", "localhost", "127.0.0.1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(made.communicate(), 60)
    assert made.returncode == 0, output
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        "ca.pem": 0o644, "etcd.pem": 0o644, "etcd-key.pem": 0o600, "client.pem": 0o644,
        "client-key.pem": 0o600}
    pki = Pki(out / "ca.pem", out / "etcd.pem", out / "etcd-key.pem", out / "client.pem",
              out / "client-key.pem")
    server = SecureEtcd(tmp_path / "etcd", tls=True, auth=False, pki=pki)
    await server.start()  # etcd takes its certificate and the CA
    try:
        client = server.client()  # and kvgate its client certificate
        try:
            await _exercise(client)
        finally:
            await client.close()
    finally:
        await server.stop()


async def test_authentication(auth_etcd: SecureEtcd) -> None:
    client = auth_etcd.client()
    try:
        await _exercise(client)
        security = client.security
        assert security is not None and security.authentications == 1
    finally:
        await client.close()


async def test_an_expired_token_is_renewed(auth_etcd: SecureEtcd) -> None:
    client = auth_etcd.client()
    try:
        await client.put(PREFIX + b"k", b"1")
        assert client.security is not None
        first = client.security.authentications
        # etcd forgets a token after --auth-token-ttl (2 s here) without use; the next call is
        # refused "invalid auth token", authenticates again and succeeds.
        await asyncio.sleep(TOKEN_TTL + 1.5)
        assert (await client.get(PREFIX + b"k")) is not None
        assert client.security.authentications == first + 1
    finally:
        await client.close()


async def test_wrong_password_is_named(auth_etcd: SecureEtcd) -> None:
    seen = []
    client = EtcdClient([auth_etcd.endpoint], on_error=seen.append,
                        security=auth_etcd.security(password="not-the-password"))
    try:
        with pytest.raises(EtcdAuthError) as refused:
            await client.get(PREFIX)
    finally:
        await client.close()
    message = str(refused.value)
    assert f"etcd refused the credentials for user '{USER}'" in message
    assert "not-the-password" not in message
    assert refused.value.kind == EtcdErrorKind.AUTH
    assert [e.kind for e in seen] == [EtcdErrorKind.AUTH]  # counted like every etcd error


async def test_no_user_against_an_etcd_that_wants_one(auth_etcd: SecureEtcd) -> None:
    client = EtcdClient([auth_etcd.endpoint])
    try:
        with pytest.raises(EtcdAuthError, match=r"configure etcd\.auth"):
            await client.get(PREFIX)
    finally:
        await client.close()


async def test_outside_the_granted_prefix(auth_etcd: SecureEtcd) -> None:
    client = auth_etcd.client()
    try:
        with pytest.raises(EtcdAuthError, match=f"etcd user '{USER}' may not do this"):
            await client.get(b"/elsewhere/")
    finally:
        await client.close()
    assert PASSWORD  # the fixture's password is what the client used
