"""`etcd.tls` and `etcd.auth`: their keys, and the files they name, read and checked when the
config is read, so a service never starts with a certificate it cannot use (validate, then act).
The `etcd:` section (`sections.etcd`) holds them.

Relative paths are taken from the YAML file's folder and stored absolute, so the config a
service hands to another (`kvgate up` writes one) means the same files.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any

from kvgate.config.fields import Fields, Path
from kvgate.config.schema import Custom, key

PASSWORD_ENV = "KVGATE_ETCD_PASSWORD"
MAX_FILE_BYTES = 1 << 20  # a certificate bundle or a password is a few KiB
_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = b"PRIVATE KEY-----"


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd (`etcd.tls`): absolute paths of PEM files, checked when the config is read."""

    ca: str | None = key(Custom(Fields.string, "file"), "the PEM CA that signed etcd's "
                         "certificate", default=None, default_doc="the system's CAs")
    cert: str | None = key(Custom(Fields.string, "file"), "a PEM client certificate (chain), for "
                           "an etcd with `--client-cert-auth`; with `key`", default=None)
    key: str | None = key(Custom(Fields.string, "file"), "the client certificate's unencrypted "
                          "PEM key; with `cert`", default=None)


@dataclass(frozen=True, slots=True)
class EtcdAuth:
    """etcd user authentication (`etcd.auth`). The password itself is never in the config: it is
    read from `password_file`, else from the KVGATE_ETCD_PASSWORD environment variable."""

    username: str = key(Custom(Fields.string, "string"), "the etcd user kvgate authenticates as",
                        default="", default_doc="required")
    password_file: str | None = key(
        Custom(Fields.string, "file"), "the password (one line; a final newline is dropped); "
        "without it, the environment variable `KVGATE_ETCD_PASSWORD`. Never in the YAML itself",
        default=None)


def read_tls(f: Fields, value: Any, path: Path, base: FilePath) -> EtcdTls | None:
    raw = f.mapping(value, path, ("ca", "cert", "key"))
    if not isinstance(value, dict):
        return None
    ca = _pem_file(f, raw, "ca", path, base, _CERTIFICATE, "a PEM certificate")
    cert = _pem_file(f, raw, "cert", path, base, _CERTIFICATE, "a PEM certificate")
    key = _pem_file(f, raw, "key", path, base, _PRIVATE_KEY, "a PEM private key")
    if ("cert" in raw) != ("key" in raw):
        missing, given = ("key", "cert") if "cert" in raw else ("cert", "key")
        f.error((*path, missing), f"required with {given}: a client certificate needs its key "
                "(give both, or neither)")
        return None
    if ca is not None:
        _check_ca(f, (*path, "ca"), ca)
    if cert is not None and key is not None:
        _check_pair(f, (*path, "key"), cert, key)
    return EtcdTls(ca=ca, cert=cert, key=key)


def read_auth(f: Fields, value: Any, path: Path, base: FilePath) -> EtcdAuth | None:
    raw = f.mapping(value, path, ("username", "password_file"))
    if not isinstance(value, dict):
        return None
    username = None
    if "username" not in raw:
        f.error((*path, "username"), "required")
    else:
        username = f.string(raw["username"], (*path, "username"))
    password_file = None
    if raw.get("password_file") is not None:
        where = (*path, "password_file")
        password_file = _file(f, raw["password_file"], where, base)
        if password_file is not None:
            data = _read(f, where, password_file)
            if data is not None and not data.rstrip(b"\r\n"):
                f.error(where, f"{password_file} is empty")
    elif not os.environ.get(PASSWORD_ENV):
        # Allowed: the services may run where the variable is set; they refuse to start without
        # a password.
        f.warn(path, f"no password: give password_file, or set {PASSWORD_ENV} where the "
               "services run")
    if username is None:
        return None
    return EtcdAuth(username=username, password_file=password_file)


def _pem_file(
    f: Fields, raw: dict[str, Any], key: str, path: Path, base: FilePath, marker: bytes,
    what: str,
) -> str | None:
    if raw.get(key) is None:
        return None
    where = (*path, key)
    name = _file(f, raw[key], where, base)
    if name is None:
        return None
    data = _read(f, where, name)
    if data is None:
        return None
    if marker not in data:
        f.error(where, f"{name} is not {what} (no {marker.decode().strip('-')} block)")
        return None
    return name


def _file(f: Fields, value: Any, where: Path, base: FilePath) -> str | None:
    text = f.string(value, where)
    if text is None:
        return None
    return str(base / FilePath(text).expanduser())


def _read(f: Fields, where: Path, name: str) -> bytes | None:
    try:
        with open(name, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        f.error(where, f"cannot read {name}: {exc.strerror or exc}")
        return None
    if len(data) > MAX_FILE_BYTES:
        f.error(where, f"{name} is over {MAX_FILE_BYTES >> 20} MiB: not a certificate, key or "
                "password file")
        return None
    return data


def _check_ca(f: Fields, where: Path, ca: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        f.error(where, f"{ca}: no usable CA certificate in it ({exc.reason or exc})")


def _check_pair(f: Fields, where: Path, cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        # An encrypted key would make OpenSSL prompt on the terminal; gRPC cannot use one anyway.
        context.load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, ValueError) as exc:
        f.error(where, f"{key} does not fit certificate {cert}, or is encrypted (gRPC needs an "
                f"unencrypted PEM key): {getattr(exc, 'reason', None) or exc}")


def _no_password() -> bytes:
    raise ValueError("the key is encrypted")
