"""Finding, authenticating to and calling the admin API; turning failures into exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import grpc

from kvgate.admin_api.auth import TOKEN_ENV, TokenError, is_loopback, load_token
from kvgate.admin_api.tls import CA_ENV, TlsError, channel_credentials
from kvgate.admin_api.token_file import read_token, token_path
from kvgate.admin_api.v1 import admin_pb2_grpc
from kvgate.config.fields import Fields
from kvgate.config.model import HostPort

ADMIN_ENV = "KVGATE_ADMIN"
DEFAULT_ADMIN = "127.0.0.1:18001"

EXIT_OK = 0
EXIT_FAILED = 1  # the admin API refused or could not do it
EXIT_USAGE = 2  # the command line (or the request it made) is wrong
EXIT_UNREACHABLE = 3  # no admin API answered


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin", metavar="HOST:PORT",
        help=f"admin API address (default: ${ADMIN_ENV}, else {DEFAULT_ADMIN})",
    )
    parser.add_argument(
        "--token-file", metavar="FILE",
        help=f"file holding the admin token (default: ${TOKEN_ENV}, else, for an admin API on "
        "loopback, the operator token its control plane wrote for this user)",
    )
    parser.add_argument(
        "--tls-ca", metavar="FILE",
        help=f"the admin API serves TLS: trust certificates signed by this PEM CA (default: "
        f"${CA_ENV}; without it the connection is plaintext)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="give up on the admin API after this long (default: 10)")


def admin_address(args: argparse.Namespace) -> HostPort:
    raw = args.admin or os.environ.get(ADMIN_ENV) or DEFAULT_ADMIN
    source = "--admin" if args.admin else (ADMIN_ENV if os.environ.get(ADMIN_ENV) else "default")
    fields = Fields()
    address = fields.host_port(raw, (source,), require_ip=False)
    if address is None:
        raise CliError("; ".join(str(p) for p in fields.problems), EXIT_USAGE)
    return address


def find_token(file: str | None, address: HostPort) -> tuple[str | None, str]:
    """The token to send, and where it came from: `--token-file`, else $KVGATE_ADMIN_TOKEN,
    else, for an admin API on loopback, the operator token its control plane wrote for this user
    (never sent anywhere else: it is this machine's)."""
    token = load_token(file=file)
    if token is not None:
        return token, file or TOKEN_ENV
    if is_loopback(address.host):
        path = token_path(address.port)
        found = read_token(path)
        if found is not None:
            return found, str(path)
    return None, ""


class AdminClient:
    """A blocking stub on one channel; every call carries the token and a deadline."""

    def __init__(self, address: HostPort, token: str | None, timeout: float,
                 tls: grpc.ChannelCredentials | None = None, token_source: str = "") -> None:
        self.address = address
        self._token = token
        self._token_source = token_source  # where the token came from, for error messages
        self._timeout = timeout
        self._tls = tls is not None
        self._channel = (grpc.insecure_channel(str(address)) if tls is None
                         else grpc.secure_channel(str(address), tls))
        self._stub = admin_pb2_grpc.AdminStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def call(self, method: str, request: Any) -> Any:
        metadata = (("authorization", f"Bearer {self._token}"),) if self._token else ()
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise self._explain(method, exc) from None

    def _explain(self, method: str, exc: grpc.RpcError) -> CliError:
        code: grpc.StatusCode = exc.code()
        details: str = exc.details() or code.name
        where = f"admin API at {self.address}"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # The server itself answers UNAVAILABLE when etcd is down; only a channel that never
            # connected means nothing is listening there.
            if not self._connected():
                tls = ("a TLS connection failed: does it serve TLS with a certificate your "
                       "--tls-ca signed?" if self._tls else
                       f"if it serves TLS, pass --tls-ca or set {CA_ENV}")
                return CliError(
                    f"cannot reach the {where} ({details}); is the control plane running? "
                    f"(set --admin HOST:PORT or {ADMIN_ENV}; {tls})", EXIT_UNREACHABLE,
                )
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return CliError(f"{where} did not answer within {self._timeout:g}s", EXIT_FAILED)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            hint = (f"the token was refused (from {self._token_source})" if self._token
                    else f"no token given: set {TOKEN_ENV} or pass --token-file")
            return CliError(f"{where} refused the call ({hint}): {details}", EXIT_FAILED)
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return CliError(f"{where} refused the call: {details}", EXIT_FAILED)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return CliError(f"{where} does not offer {method} (an older control plane?)",
                            EXIT_FAILED)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return CliError(details, EXIT_USAGE)
        return CliError(details, EXIT_FAILED)

    def _connected(self) -> bool:
        try:
            grpc.channel_ready_future(self._channel).result(timeout=0.3)
        except grpc.FutureTimeoutError:
            return False
        return True


def run_with_client(args: argparse.Namespace, action: Callable[[AdminClient], int]) -> int:
    """Opens a client from the common arguments, runs `action`, prints errors on one line."""
    try:
        address = admin_address(args)
        token, source = find_token(args.token_file, address)
        if args.timeout <= 0:
            raise CliError("--timeout: must be > 0 seconds", EXIT_USAGE)
        ca = args.tls_ca or os.environ.get(CA_ENV) or None
        client = AdminClient(address, token, args.timeout,
                             channel_credentials(ca) if ca else None, token_source=source)
        try:
            return action(client)
        finally:
            client.close()
    except (TokenError, TlsError) as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return exc.code
