"""`kvgate up`: etcd, control plane, ext_proc and Envoy on this machine, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

from kvgate.config import Config, ConfigError, load_file, load_text
from kvgate.config.dump import to_yaml
from kvgate.runtime.child import ChildFailed
from kvgate_cli.up.ports import PortsError, parse_ports, with_ports
from stack.local import Stack


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="kvgate YAML file (default: built-in defaults)")
    parser.add_argument(
        "--engines", help="comma-separated engine URLs to front (instead of the YAML's pools)",
    )
    parser.add_argument(
        "--emulated", type=int, default=4, metavar="N",
        help="with no engines configured: run N emulated vLLM engines sharing a DDR pool "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--time-scale", default="1",
        help="emulated engines only: wall seconds per emulated second, e.g. 1/60 (default 1)",
    )
    parser.add_argument(
        "--ports", metavar="auto|BASE",
        help="take every port of the stack from the OS ('auto') or consecutive from BASE "
        "(gateway, Envoy admin, xDS, admin API, ext_proc metrics, ext_proc), instead of the "
        "YAML's or the defaults (8080, 9901, 18000, 18001, 9003, 9002)",
    )
    parser.add_argument(
        "--upstream-header", metavar="NAME", nargs="?", const="x-kvgate-upstream",
        help="add a response header naming the engine (ip:port) that served each request "
        "(default name %(const)s; YAML: upstream_header). Off unless asked: it reveals "
        "internal addresses to clients",
    )
    parser.add_argument(
        "--workdir", help="where logs, rendered configs and embedded etcd data go "
        "(default: a new temporary directory)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = load_file(args.config) if args.config else Config()
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print("kvgate up: configuration rejected; nothing was started", file=sys.stderr)
        return 1
    if args.engines:
        try:
            config = with_engines(config, args.engines)
        except ConfigError as exc:
            print(exc.render(), file=sys.stderr)
            print("kvgate up: --engines rejected; nothing was started", file=sys.stderr)
            return 1
    try:
        if args.ports:
            config = with_ports(config, parse_ports(args.ports))
        if args.upstream_header:
            config = _with_upstream_header(config, args.upstream_header)
    except (PortsError, ConfigError) as exc:
        print(exc.render() if isinstance(exc, ConfigError) else f"kvgate up: {exc}",
              file=sys.stderr)
        print("kvgate up: nothing was started", file=sys.stderr)
        return 1
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kvgate-up-"))
    stack = Stack(
        config, workdir, report=_say,
        emulated_engines=0 if config.pools else args.emulated,
        emulator_args=("--time-scale", args.time_scale),
    )
    if not config.pools and args.emulated < 1:
        print("kvgate up: no engines: configure pools, pass --engines, or --emulated N",
              file=sys.stderr)
        return 1
    return asyncio.run(_up(stack, workdir))


def with_engines(config: Config, engines: str) -> Config:
    """The config fronting `engines` (URLs or host:port, comma separated) as its one pool."""
    items = [e.strip() for e in engines.split(",") if e.strip()]
    text = to_yaml(replace(config, pools=(), routes=()))
    data = yaml.safe_load(text)
    data["pools"] = [{"name": "default", "endpoints": items}]
    data["routes"] = []
    return load_text(yaml.safe_dump(data), source="--engines")


def _with_upstream_header(config: Config, name: str) -> Config:
    """Validated as the YAML key is, so a bad name reads the same either way."""
    checked = load_text(yaml.safe_dump({"upstream_header": name}), source="--upstream-header")
    return replace(config, upstream_header=checked.upstream_header)


def _say(line: str) -> None:
    print(line, flush=True)


async def _up(stack: Stack, workdir: Path) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _say(f"kvgate up: starting (logs in {workdir})")
    starting = asyncio.create_task(stack.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # Ctrl-C while starting: stop what is up, then leave
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await stack.stop()
        _say("kvgate up: interrupted; everything stopped")
        return 130
    stopping.cancel()
    try:
        starting.result()
    except ChildFailed as exc:
        print(f"kvgate up: {exc}", file=sys.stderr)
        print("kvgate up: nothing left running", file=sys.stderr)
        return 1
    _print_ready(stack)
    died = await _wait_for_stop_or_death(stack, stop)
    await stack.stop()
    if died:
        print(f"kvgate up: {died} exited unexpectedly; everything stopped", file=sys.stderr)
        return 1
    _say("kvgate up: stopped")
    return 0


def _print_ready(stack: Stack) -> None:
    config = stack.config
    engines = [ep.key for pool in config.pools for ep in pool.endpoints]
    _say("")
    _say(f"kvgate is ready: gateway http://{config.listener}")
    _say(f"  Envoy admin: http://{config.envoy_admin}")
    _say(f"  control plane: xds {config.control_plane.xds}, admin API {config.control_plane.admin}")
    _say(f"  ext_proc: {', '.join(str(a) for a in config.ext_proc.addresses)}, "
         f"metrics http://{config.ext_proc.metrics}/metrics")
    _say(f"  engines: {', '.join(engines)}")
    for line in examples(config):
        _say(line)


def examples(config: Config) -> list[str]:
    """What to try and how to operate this stack, with its own addresses and header names.

    Which engine served a request: from the opt-in upstream header if the config sets one,
    else from the session's binding (`kvgate sessions show`), which works with any engine."""
    header = config.session.headers[0]
    url = f"http://{config.listener}"
    admin = config.control_plane.admin
    flag = "" if (admin.host, admin.port) == ("127.0.0.1", 18001) else f" --admin {admin}"
    body = '{"messages": [{"role": "user", "content": "hello"}]}'
    curl = (f"    curl -s {url}/v1/chat/completions -H 'content-type: application/json' "
            f"-H '{header}: demo-1' \\\n      -d '{body}'")
    lines = ["", "  try it (the session header keeps a conversation on the engine holding its "
             "KV cache):"]
    if config.upstream_header:
        lines.append(f"{curl} -i | grep -i {config.upstream_header}")
    else:
        lines += [curl, f"    kvgate sessions show demo-1{flag}      (the engine it is bound to)"]
    lines.append(
        f"    python -c \"import openai; c = openai.OpenAI(base_url='{url}/v1', api_key='-'); "
        f"m = c.models.list().data[0].id; print(c.chat.completions.create(model=m, "
        f"messages=[{{'role': 'user', 'content': 'hi'}}], "
        f"extra_headers={{'{header}': 'demo-1'}}).usage)\"")
    lines += [
        "",
        "  operate it:" + (f"  (or export KVGATE_ADMIN={admin})" if flag else ""),
        f"    kvgate status{flag}",
        f"    kvgate endpoints list{flag}      (drain | undrain | fail ADDRESS)",
        f"    kvgate sessions list{flag}       (show SESSION | move SESSION ENDPOINT)",
        "  Ctrl-C stops everything.",
    ]
    return lines


async def _wait_for_stop_or_death(stack: Stack, stop: asyncio.Event) -> str | None:
    while not stop.is_set():
        for component in stack.components:
            if component.child is not None and not component.child.running:
                return component.name
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
    return None
