"""`etcd.tls` and `etcd.auth` in the YAML: files checked when the config is read (readable, PEM,
a key that fits its certificate), relative paths from the YAML's folder, the password never in
the config, and the security a service builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
import yaml

from kvgate.config import ConfigError, load_file
from kvgate.config.dump import to_yaml
from kvgate.config.load import check_file
from kvgate.etcd.security import EtcdSecurityError, etcd_security
from tests.support.secure_etcd import make_pki

POOLS = "pools: [{name: p, endpoints: [10.0.0.1:8000]}]\n"


def _write(tmp_path: Path, etcd: dict[str, object]) -> Path:
    path = tmp_path / "kvgate.yaml"
    path.write_text(POOLS + yaml.safe_dump({"etcd": {"endpoints": ["etcd.example:2379"],
                                                     **etcd}}))
    return path


def _problems(path: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        load_file(path)
    return refused.value.render()


def test_tls_and_auth_are_read_and_paths_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_pki(tmp_path / "pki")
    (tmp_path / "pw").write_text("secret\n")
    monkeypatch.chdir("/")  # relative paths are the YAML file's folder, not the current one
    config = load_file(_write(tmp_path, {
        "tls": {"ca": "pki/ca.pem", "cert": "pki/client.pem", "key": "pki/client-key.pem"},
        "auth": {"username": "kvgate", "password_file": "pw"},
    }))
    assert config.etcd.tls is not None and config.etcd.auth is not None
    assert config.etcd.tls.ca == str(tmp_path / "pki/ca.pem")
    assert config.etcd.tls.key == str(tmp_path / "pki/client-key.pem")
    assert config.etcd.auth.username == "kvgate"
    assert config.etcd.auth.password_file == str(tmp_path / "pw")
    # What `kvgate up` hands its services: the same files, never the password.
    dumped = to_yaml(config)
    assert "secret" not in dumped
    again = tmp_path / "again.yaml"
    again.write_text(dumped)
    assert load_file(again).etcd == config.etcd
    security = etcd_security(config.etcd, {})
    assert security is not None and security.tls and security.username == "kvgate"
    assert "secret" not in repr(security) + str(security.describe())


def test_ca_alone_and_system_trust(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    only_ca = load_file(_write(tmp_path, {"tls": {"ca": str(pki.ca)}})).etcd.tls
    assert only_ca is not None and only_ca.cert is None and only_ca.key is None
    system = load_file(_write(tmp_path, {"tls": {}})).etcd.tls  # TLS, the system's CAs
    assert system is not None and system.ca is None


def test_unusable_files_are_named_with_their_field(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    other = make_pki(tmp_path / "other", trustme.CA())
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
                       "-----END CERTIFICATE-----\n")
    text = _problems(_write(tmp_path, {"tls": {
        "ca": str(tmp_path / "missing.pem"), "cert": str(pki.client_key),
        "key": str(pki.client_key)}}))
    assert "etcd.tls.ca: cannot read" in text and "missing.pem" in text
    assert "etcd.tls.cert:" in text and "is not a PEM certificate" in text

    text = _problems(_write(tmp_path, {"tls": {
        "ca": str(garbage), "cert": str(pki.client_cert), "key": str(other.client_key)}}))
    assert "etcd.tls.ca:" in text and "no usable CA certificate" in text
    assert "etcd.tls.key:" in text and "does not fit certificate" in text

    text = _problems(_write(tmp_path, {"tls": {"ca": str(pki.ca), "key": str(pki.client_key)}}))
    assert "etcd.tls.cert: required with key" in text
    text = _problems(_write(tmp_path, {"tls": {"ca": str(pki.ca), "crt": "x"}}))
    assert "etcd.tls.crt: unknown key" in text


def test_encrypted_key_is_refused_without_a_prompt(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    pki = make_pki(tmp_path / "pki")
    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), None)
    locked = tmp_path / "locked-key.pem"
    locked.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass")))
    text = _problems(_write(tmp_path, {"tls": {"cert": str(pki.client_cert), "key": str(locked)}}))
    assert "etcd.tls.key:" in text and "encrypted" in text


def test_auth_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGATE_ETCD_PASSWORD", raising=False)
    (tmp_path / "empty").write_text("\n")
    text = _problems(_write(tmp_path, {"auth": {"password_file": str(tmp_path / "nope")}}))
    assert "etcd.auth.username: required" in text
    assert "etcd.auth.password_file: cannot read" in text
    text = _problems(_write(tmp_path, {"auth": {"username": "u",
                                                "password_file": str(tmp_path / "empty")}}))
    assert "etcd.auth.password_file:" in text and "is empty" in text

    # No file: the password comes from the environment where the services run.
    checked = check_file(_write(tmp_path, {"auth": {"username": "kvgate"}}))
    assert "line 3: etcd.auth: no password: give password_file, or set KVGATE_ETCD_PASSWORD " \
        "where the services run" in [str(w) for w in checked.warnings]
    with pytest.raises(EtcdSecurityError, match="no password for etcd user 'kvgate'"):
        etcd_security(checked.config.etcd, {})
    security = etcd_security(checked.config.etcd, {"KVGATE_ETCD_PASSWORD": "from-env"})
    assert security is not None and security.username == "kvgate" and not security.tls
    monkeypatch.setenv("KVGATE_ETCD_PASSWORD", "set")
    assert not any("no password" in str(w) for w in check_file(
        _write(tmp_path, {"auth": {"username": "kvgate"}})).warnings)


def test_a_file_that_vanishes_after_the_check_is_named(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    config = load_file(_write(tmp_path, {"tls": {"ca": str(pki.ca)}}))
    pki.ca.unlink()
    with pytest.raises(EtcdSecurityError, match=r"etcd.tls.ca: cannot read .*ca.pem"):
        etcd_security(config.etcd)


def test_a_password_in_clear_over_the_network_is_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_ETCD_PASSWORD", "x")
    auth = {"auth": {"username": "kvgate"}}
    warnings = [str(w) for w in check_file(_write(tmp_path, auth)).warnings]
    assert any("etcd.auth: without etcd.tls the etcd password" in w for w in warnings)
    pki = make_pki(tmp_path / "pki")
    assert not check_file(_write(tmp_path, {**auth, "tls": {"ca": str(pki.ca)}})).warnings
    path = tmp_path / "local.yaml"
    path.write_text(POOLS + yaml.safe_dump({"etcd": {"endpoints": ["127.0.0.1:2379"], **auth}}))
    assert not check_file(path).warnings  # loopback: nothing crosses a network
