"""TLS for the admin API: the server's certificate and key, the CLI's trusted CA.

Off loopback the bearer token would otherwise cross the network in clear; with TLS the token and
every answer are encrypted and the CLI knows it talks to the real control plane.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc

CA_ENV = "KVGATE_ADMIN_CA"


class TlsError(Exception):
    """A certificate, key or CA file is missing, unreadable or unusable."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)  # never in logs or reprs
    cert_file: str = ""

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)])


def load_server_tls(cert_file: str | None, key_file: str | None) -> ServerTls | None:
    """Both files, or neither (plaintext); PEM, the certificate file may hold a chain."""
    if cert_file is None and key_file is None:
        return None
    if cert_file is None or key_file is None:
        raise TlsError("admin TLS needs both --admin-tls-cert and --admin-tls-key")
    cert = _read(cert_file, "certificate", b"-----BEGIN CERTIFICATE-----")
    key = _read(key_file, "key", b"PRIVATE KEY-----")
    try:  # grpc would only say "failed to bind"; OpenSSL says what is wrong
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise TlsError(f"admin TLS key {key_file} does not fit certificate {cert_file}: "
                       f"{exc.reason or exc}") from None
    return ServerTls(cert, key, cert_file)


def channel_credentials(ca_file: str) -> grpc.ChannelCredentials:
    """Trust the admin API's certificate if `ca_file` (PEM) signed it."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, "CA certificate", b"-----BEGIN CERTIFICATE-----")
    )


def _read(path: str, what: str, marker: bytes) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read admin TLS {what} {path}: {exc.strerror}") from None
    if marker not in data:
        raise TlsError(f"admin TLS {what} {path} is not PEM (no {marker.decode().strip('-')})")
    return data
