"""`kvgate envoy-config -c FILE`: the Envoy bootstrap for a config, as JSON: static (everything
inline) or, with --ads, pointing at the control plane."""

from __future__ import annotations

import argparse
import sys

from control_plane.resources.bootstrap import ads_bootstrap, static_bootstrap, to_json
from kvgate.config.fields import Fields
from kvgate.config.flags import load_or_report
from kvgate.contract.modes import RoutingMode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="kvgate YAML file")
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    parser.add_argument("--node-id", default="kvgate-gateway", help="Envoy node id")
    parser.add_argument(
        "--ads", action="store_true",
        help="a bootstrap that takes its configuration over ADS from the control plane",
    )
    parser.add_argument(
        "--xds", action="append", metavar="HOST:PORT",
        help="with --ads: control-plane replica(s) (default: control_plane.xds); repeatable",
    )
    parser.add_argument(
        "--mode", default=RoutingMode.AFFINITY.value,
        # a DDR pool is the fleet's, not Envoy's: affinity+ddr renders as affinity
        choices=[m.value for m in RoutingMode if not m.ddr_pool],
        help="affinity (kvgate) or a baseline without ext_proc: ring_hash, round_robin",
    )


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config, require_pools=not args.ads)
    if config is None:
        return 1
    if not config.pools and not args.ads:
        print(f"{args.config}: pools: no pools configured; nothing to route to", file=sys.stderr)
        return 1
    if args.ads:
        fields = Fields()
        targets = [fields.host_port(x, ("--xds",), require_ip=False) for x in args.xds or []]
        if fields.problems:
            print("\n".join(str(p) for p in fields.problems), file=sys.stderr)
            return 2
        document = ads_bootstrap(config, node_id=args.node_id,
                                 xds=[t for t in targets if t is not None] or None)
    else:
        document = static_bootstrap(config, node_id=args.node_id, mode=RoutingMode(args.mode))
    text = to_json(document)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0
