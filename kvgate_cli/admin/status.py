"""`kvgate status`: the control plane, its Envoys (acked versions, NACKs) and every endpoint."""

from __future__ import annotations

import argparse

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate_cli.admin import render
from kvgate_cli.admin.client import EXIT_OK, AdminClient, add_common_arguments, run_with_client


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return run_with_client(args, lambda client: _show(client, args.json))


def _show(client: AdminClient, as_json: bool) -> int:
    answer = client.call("Status", pb.StatusRequest())
    print(render.dumps(render.status_dict(answer)) if as_json else render.status_text(answer))
    return EXIT_OK
