"""`kvgate ext-proc` / `python -m ext_proc`: run one ext_proc replica."""

from __future__ import annotations

import argparse
import sys

from ext_proc.service import ExtProcOptions, ExtProcService
from kvgate.admin_api.tls import TlsError
from kvgate.config.fields import Fields
from kvgate.config.flags import address_flag, etcd_flag, flags_refused
from kvgate.etcd.security import EtcdSecurityError
from kvgate.runtime.tasks.serve import command_config, serve_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="kvgate YAML file")
    parser.add_argument("--listen", help="HOST:PORT to serve on (default: ext_proc.address[0])")
    parser.add_argument("--metrics", help="HOST:PORT for /metrics (default: ext_proc.metrics)")
    parser.add_argument("--etcd", help="comma-separated etcd endpoints (default: etcd.endpoints)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def run(args: argparse.Namespace) -> int:
    config = command_config(args)
    if config is None:
        return 1
    if not config.pools:
        print(f"{args.config}: pools: no pools configured; nothing to route to", file=sys.stderr)
        return 1
    fields = Fields()
    listen = address_flag(fields, args.listen, "--listen", config.ext_proc.addresses[0])
    metrics = address_flag(fields, args.metrics, "--metrics", config.ext_proc.metrics)
    if flags_refused(fields) or listen is None:
        return 2
    etcd = etcd_flag(args.etcd, config)
    options = ExtProcOptions(listen=listen, metrics=metrics, etcd_endpoints=etcd)
    return serve_command("ext_proc", lambda: ExtProcService(config, options),
                         (EtcdSecurityError, TlsError))


