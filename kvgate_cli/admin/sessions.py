"""`kvgate sessions list|show|move`."""

from __future__ import annotations

import argparse

from kvgate.admin_api.v1 import admin_pb2 as pb
from kvgate_cli.admin import render
from kvgate_cli.admin.client import (
    EXIT_OK,
    EXIT_USAGE,
    AdminClient,
    CliError,
    add_common_arguments,
    run_with_client,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="session bindings, by pool then session")
    listing.add_argument("--pool", help="only this pool")
    listing.add_argument("--endpoint", metavar="ADDRESS", help="only sessions bound to it")
    listing.add_argument("--limit", type=int, default=100,
                         help="at most this many (default 100, at most 10000)")
    listing.add_argument("--after", metavar="SESSION",
                         help="start after this session (POOL/SESSION as the previous page's "
                              "last line says, or a SESSION of --pool)")
    show = sub.add_parser("show", help="where a session is bound, in every pool")
    show.add_argument("session", metavar="SESSION", help="as the client sends it, or its UUID")
    move = sub.add_parser("move", help="re-bind a session to an active endpoint of its pool")
    move.add_argument("session", metavar="SESSION", help="as the client sends it, or its UUID")
    move.add_argument("endpoint", metavar="ENDPOINT", help="target endpoint, ip:port")
    move.add_argument("--pool", help="its pool (needed when it is bound in several)")
    for p in (listing, show, move):
        add_common_arguments(p)


def run(args: argparse.Namespace) -> int:
    return run_with_client(args, lambda client: _act(client, args))


def _act(client: AdminClient, args: argparse.Namespace) -> int:
    if args.action == "list":
        if not 0 < args.limit <= 10_000:
            raise CliError("--limit: must be 1..10000 (page with --after)", EXIT_USAGE)
        answer = client.call("ListSessions", pb.ListSessionsRequest(
            pool=args.pool or None, endpoint=args.endpoint or None, limit=args.limit,
            after=args.after or None))
        found = list(answer.sessions)
        following = answer.next_after if answer.HasField("next_after") else None
        if args.json:  # a list as ever; the next page starts after its last pool/session
            print(render.dumps([render.binding_dict(b) for b in found]))
        else:
            print(render.sessions_table(found))
            if following is not None:
                print(f"more: --after {following}")
        return EXIT_OK
    elif args.action == "show":
        found = list(client.call("ShowSession",
                                 pb.ShowSessionRequest(session=args.session)).bindings)
    else:
        moved = client.call("MoveSession", pb.MoveSessionRequest(
            session=args.session, endpoint=args.endpoint, pool=args.pool or None)).binding
        if args.json:
            print(render.dumps(render.binding_dict(moved)))
        else:
            print(f"session {moved.session} in {moved.pool} now on {moved.endpoint}")
        return EXIT_OK
    if args.json:
        print(render.dumps([render.binding_dict(b) for b in found]))
    else:
        print(render.sessions_table(found))
        for line in render.turn_lines(found):
            print(line)
    return EXIT_OK
