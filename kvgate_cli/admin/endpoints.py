"""`kvgate endpoints list|drain|undrain|fail`."""

from __future__ import annotations

import argparse
import sys

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate.config.fields import Fields
from kvgate_cli.admin import render
from kvgate_cli.admin.client import (
    EXIT_OK,
    EXIT_USAGE,
    AdminClient,
    add_common_arguments,
    run_with_client,
)

# The longest drain deadline accepted: a week, beyond which "drain" is really "remove".
MAX_DEADLINE_S = 7 * 86400.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="endpoints with state, sessions and load")
    listing.add_argument("--pool", help="only this pool")
    drain = sub.add_parser("drain", help="no new sessions; existing ones stay until idle "
                                         "or until --deadline, then move")
    undrain = sub.add_parser("undrain", help="back to active (undoes drain or fail)")
    fail = sub.add_parser("fail", help="mark failed now: its sessions move to siblings")
    for p in (drain, undrain, fail):
        p.add_argument("address", metavar="ADDRESS", help="the endpoint, ip:port")
        p.add_argument("--pool", help="its pool (needed when the address is in several)")
    drain.add_argument("--deadline", metavar="DURATION",
                       help="move remaining sessions after this long, e.g. 90s, 10m, 1h")
    for p in (listing, drain, undrain, fail):
        add_common_arguments(p)


def run(args: argparse.Namespace) -> int:
    deadline: float | None = None
    if args.action == "drain" and args.deadline is not None:
        fields = Fields()
        deadline = fields.duration(args.deadline, ("--deadline",), 0, MAX_DEADLINE_S)
        if deadline is None:
            print(f"kvgate: {fields.problems[0]}", file=sys.stderr)
            return EXIT_USAGE
    return run_with_client(args, lambda client: _act(client, args, deadline))


def _act(client: AdminClient, args: argparse.Namespace, deadline: float | None) -> int:
    if args.action == "list":
        listed = client.call("ListEndpoints", pb.ListEndpointsRequest(pool=args.pool or None))
        if args.json:
            print(render.dumps([render.endpoint_status_dict(e) for e in listed.endpoints]))
        else:
            print(render.endpoints_table(listed.endpoints))
            if listed.HasField("sessions_note"):
                print(f"sessions: {listed.sessions_note}")
        return EXIT_OK
    pool = args.pool or None  # None leaves the optional field unset
    if args.action == "drain":
        answer = client.call("DrainEndpoint", pb.DrainEndpointRequest(
            address=args.address, pool=pool, deadline_seconds=deadline))
    elif args.action == "undrain":
        answer = client.call("UndrainEndpoint",
                             pb.UndrainEndpointRequest(address=args.address, pool=pool))
    else:
        answer = client.call("FailEndpoint",
                             pb.FailEndpointRequest(address=args.address, pool=pool))
    if args.json:
        print(render.dumps(render.endpoint_dict(answer.endpoint)))
    else:
        print(render.endpoint_line(answer.endpoint))
    return EXIT_OK
