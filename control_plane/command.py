"""`kvgate control-plane` / `python -m control_plane`."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from control_plane.service import ControlPlaneService
from kvgate.config import ConfigError, load_file
from kvgate.config.fields import Fields
from kvgate.observability.logs import configure_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="kvgate YAML file")
    parser.add_argument("--etcd", help="comma-separated etcd endpoints (default: etcd.endpoints)")
    parser.add_argument("--admin", help="HOST:PORT of the admin API (default: control_plane.admin)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    try:
        config = load_file(args.config)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    etcd = tuple(e.strip() for e in (args.etcd or "").split(",") if e.strip()) or tuple(
        str(e) for e in config.etcd.endpoints or ()
    )
    if not etcd:
        print(f"{args.config}: etcd.endpoints: required (or pass --etcd)", file=sys.stderr)
        return 1
    fields = Fields()
    admin = (fields.host_port(args.admin, ("--admin",), require_ip=False)
             if args.admin else config.control_plane.admin)
    if admin is None:
        print("\n".join(str(p) for p in fields.problems), file=sys.stderr)
        return 2
    return asyncio.run(_serve(ControlPlaneService(config, etcd, admin)))


async def _serve(service: ControlPlaneService) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
    except (OSError, Exception) as exc:
        print(f"control plane: {exc}", file=sys.stderr)
        await service.stop(grace=0)
        return 1
    await stop.wait()
    await service.stop()
    return 0
