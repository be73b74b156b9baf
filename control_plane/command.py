"""`kvgate control-plane` / `python -m control_plane`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from control_plane.admin.server import TokenError, load_token
from control_plane.service import ControlPlaneOptions, ControlPlaneService
from kvgate.admin_api.auth import READ_TOKEN_ENV
from kvgate.admin_api.tls import TlsError, load_server_tls
from kvgate.config.fields import Fields
from kvgate.config.flags import address_flag, etcd_flag, flags_refused
from kvgate.etcd.security import EtcdSecurityError
from kvgate.runtime.tasks.serve import command_config, serve_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="kvgate YAML file (reloaded on "
                        "SIGHUP and when it changes)")
    parser.add_argument("--etcd", help="comma-separated etcd endpoints (default: etcd.endpoints)")
    parser.add_argument("--xds", help="HOST:PORT for ADS (default: control_plane.xds)")
    parser.add_argument("--admin", help="HOST:PORT of the admin API (default: control_plane.admin)")
    parser.add_argument("--admin-token-file", help="file holding the admin API's operator token "
                        "(default: $KVGATE_ADMIN_TOKEN); required off loopback; on loopback "
                        "without one, the control plane makes one for its user's kvgate CLI")
    parser.add_argument("--admin-read-token-file", help="file holding a read-only admin token "
                        f"(default: ${READ_TOKEN_ENV}): status and lists, never drain, fail or "
                        "move")
    parser.add_argument("--admin-tls-cert", metavar="FILE", help="PEM certificate (chain) for "
                        "the admin API; with --admin-tls-key it serves TLS only")
    parser.add_argument("--admin-tls-key", metavar="FILE", help="PEM private key of "
                        "--admin-tls-cert")
    parser.add_argument("--metrics", help="HOST:PORT for /metrics and /healthz (default: none)")
    parser.add_argument("--identity", help="this replica's name in leader election "
                        "(default: hostname-pid)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def run(args: argparse.Namespace) -> int:
    config = command_config(args)
    if config is None:
        return 1
    etcd = etcd_flag(args.etcd, config)
    if not etcd:
        print(f"{args.config}: etcd.endpoints: required (or pass --etcd)", file=sys.stderr)
        return 1
    fields = Fields()
    admin = address_flag(fields, args.admin, "--admin", config.control_plane.admin)
    xds = address_flag(fields, args.xds, "--xds", config.control_plane.xds)
    metrics = address_flag(fields, args.metrics, "--metrics", None)
    if flags_refused(fields) or admin is None or xds is None:
        return 2
    try:
        token = load_token(file=args.admin_token_file)
        read_token = load_token(READ_TOKEN_ENV, file=args.admin_read_token_file)
        if read_token is not None and read_token == token:
            raise TokenError("the read-only admin token must differ from the operator token")
        tls = load_server_tls(args.admin_tls_cert, args.admin_tls_key)
    except (TokenError, TlsError) as exc:
        print(f"control plane: {exc}", file=sys.stderr)
        return 2
    config = replace(config, control_plane=replace(config.control_plane, xds=xds, admin=admin))
    options = ControlPlaneOptions(
        config_path=Path(args.config), etcd=etcd, admin=admin, metrics=metrics,
        admin_token=token, admin_read_token=read_token, admin_tls=tls,
        **({"identity": args.identity} if args.identity else {}),
    )
    return serve_command("control plane", lambda: ControlPlaneService(config, options),
                         (EtcdSecurityError,), on_hangup=lambda s: s.request_reload)
