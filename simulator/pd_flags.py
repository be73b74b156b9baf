"""`kvgate simulate --pd P:D` and the P/D modes' names in `--modes`."""

from __future__ import annotations

import argparse
from typing import Any

from benchkit.modes import ModeError, parse_simulated_modes
from kvgate.config.sections.disaggregation import DEFAULT_SKIP_PREFILL_BELOW, SkipRule
from kvgate.contract.modes import PdMode, RoutingMode
from simulator.setup import SimConfig

# `--modes pd`: colocated kvgate beside every P/D policy, on the same devices.
PD_SET: tuple[RoutingMode | PdMode, ...] = (RoutingMode.AFFINITY_DDR, *PdMode)


def parse_modes(text: str) -> tuple[RoutingMode | PdMode, ...]:
    """`--modes`: the simulator's modes (`all`), `pd` (affinity+ddr and every P/D mode), or
    comma-separated names of either kind."""
    if text.strip() == "pd":
        return PD_SET
    modes: list[RoutingMode | PdMode] = []
    for name in text.split(","):
        name = name.strip()
        if name.startswith("pd-"):
            try:
                modes.append(PdMode(name))
            except ValueError:
                raise ModeError(f"unknown P/D mode {name!r} (choose from "
                                f"{', '.join(PdMode)})") from None
        else:
            modes.extend(parse_simulated_modes(name))
    return tuple(modes)


def parse_split(text: str) -> tuple[int, int]:
    """`--pd P:D`: P prefill engines, then D decode engines, both at least 1."""
    p, sep, d = text.partition(":")
    try:
        split = (int(p), int(d))
    except ValueError:
        split = (0, 0)
    if not sep or min(split) < 1:
        raise argparse.ArgumentTypeError(f"expected P:D, two counts >= 1 (e.g. 4:12), got "
                                         f"{text!r}")
    return split


def add_pd_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pd", type=parse_split, metavar="P:D",
        help="a prefill/decode fleet for the P/D modes: the first P engines prefill, the next "
             "D decode (P + D = --engines); colocated modes use every engine as it is")
    parser.add_argument(
        "--skip-prefill-below", type=int, default=DEFAULT_SKIP_PREFILL_BELOW, metavar="TOKENS",
        help="pd-kvgate: a turn goes to a prefill engine only when its decode engine lacks at "
             "least this many tokens (disaggregation.skip_prefill_below; %(default)s)")
    parser.add_argument(
        "--skip-rule", type=SkipRule, choices=list(SkipRule), default=SkipRule.THRESHOLD,
        help="pd-kvgate: what keeps a turn under --skip-prefill-below on its decode engine: "
             "threshold (that alone) or streams (also that its prefill costs the decode "
             "engine's running streams fewer seconds than disaggregating costs the turn; "
             "disaggregation.skip_rule; %(default)s)")
    parser.add_argument(
        "--pd-decode-puts", choices=["on", "off"], default="off",
        help="P/D modes: the decode engines also put each prompt they computed or pulled to "
             "the DDR pool at its first token, as vllm-ascend's AscendStoreConnector does with "
             "consumer_is_to_put: true (answers stay out: save_decode_cache off); off: only "
             "the prefill engines write the pool (%(default)s)")


def check_pd(args: argparse.Namespace, engines: int) -> None:
    """The split against the fleet and the modes, before anything runs."""
    pd_modes = [m for m in args.modes if isinstance(m, PdMode)]
    if args.pd is None:
        if pd_modes:
            raise ValueError(f"mode {pd_modes[0]} needs --pd P:D (prefill:decode engines)")
        return
    if args.skip_prefill_below < 0:
        raise ValueError(f"--skip-prefill-below must be >= 0, got {args.skip_prefill_below}")
    if sum(args.pd) != engines:
        raise ValueError(f"--pd {args.pd[0]}:{args.pd[1]} is {sum(args.pd)} engines, but "
                         f"--engines is {engines}")
    if pd_modes and (args.fail or args.drain):
        raise ValueError("--fail and --drain are not simulated for P/D modes")


def pd_description(config: SimConfig) -> dict[str, Any]:
    """The split and what the P/D modes assume, for a result's JSON (empty: colocated)."""
    if config.pd is None:
        return {}
    options = config.engine
    # Named only when on: results without it keep their bytes.
    puts = {"decode_puts": True} if config.decode_puts else {}
    return {"pd": {"prefill_engines": config.pd[0], "decode_engines": config.pd[1],
                   "skip_prefill_below": config.skip_prefill_below,
                   "skip_rule": str(config.skip_rule),
                   "link_gbps": options.ddr_gbps, "link_fixed_ms": options.transfer_fixed_ms,
                   **puts}}
