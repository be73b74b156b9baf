"""`kvgate envoy-config -c FILE`: the static Envoy bootstrap for a config, as JSON."""

from __future__ import annotations

import argparse
import sys

from control_plane.resources.bootstrap import static_bootstrap, to_json
from control_plane.resources.names import RoutingMode
from kvgate.config import ConfigError, load_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="kvgate YAML file")
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    parser.add_argument("--node-id", default="kvgate-gateway", help="Envoy node id")
    parser.add_argument(
        "--mode", default=RoutingMode.AFFINITY.value, choices=[m.value for m in RoutingMode],
        help="affinity (kvgate) or a baseline without ext_proc: ring_hash, round_robin",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = load_file(args.config)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    if not config.pools:
        print(f"{args.config}: pools: no pools configured; nothing to route to", file=sys.stderr)
        return 1
    text = to_json(static_bootstrap(config, node_id=args.node_id, mode=RoutingMode(args.mode)))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0
