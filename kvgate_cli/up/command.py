"""`kvgate up`: etcd, control plane, ext_proc and Envoy on this machine, until Ctrl-C.

SIGINT, SIGTERM and SIGHUP (a closed terminal) stop everything; the children also die with it
when it is killed outright (kvgate.runtime.children.child). A child that dies is started again
(kvgate_cli.up.supervise); one that cannot come back stops everything. Its work directory goes
with it, unless something failed: then it is kept, with the logs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import dataclass, replace

import yaml

from emulator.command import role_list, time_scale
from emulator.options import DEFAULT_HBM_TOKENS, EmulatorOptions
from emulator.pool_profiles import DEFAULT_PROFILE, PROFILES
from kvgate.admin_api.auth import TOKEN_ENV
from kvgate.admin_api.token_file import token_path
from kvgate.config import Config, ConfigError
from kvgate.config.flags import report_warnings, with_engines
from kvgate.config.load import check_file, load_text
from kvgate.contract.states import Role
from kvgate.placement.cost import EngineCost
from kvgate.runtime.children.child import ChildFailed
from kvgate.runtime.children.ports import NoFreePorts, wait_for_ports
from kvgate_cli.up import workdir as workdirs
from kvgate_cli.up.engines import Unhealthy, unhealthy_engines
from kvgate_cli.up.kv_events import event_ports, with_event_streams
from kvgate_cli.up.ports import PortsError, parse_ports, with_ports
from kvgate_cli.up.supervise import ChildSupervisor, GaveUp
from stack.engine_speed import for_emulated_fleet
from stack.local import Stack


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="kvgate YAML file (default: built-in defaults)")
    parser.add_argument(
        "--engines", help="comma-separated engine URLs to front (instead of the YAML's pools)",
    )
    _add_emulated_arguments(parser)
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
        "(default: a new temporary directory); removed at exit if this run made it, kept "
        "with its logs when a start or a child failed",
    )
    parser.add_argument(
        "--keep-workdir", action="store_true",
        help="keep the work directory (logs, etcd data) when kvgate up ends",
    )



def _add_emulated_arguments(parser: argparse.ArgumentParser) -> None:
    """The emulated fleet's shape, when no engines are configured."""
    parser.add_argument(
        "--emulated", type=int, default=4, metavar="N",
        help="with no engines configured: run N emulated vLLM engines sharing a DDR pool "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--emulator-processes", type=int, default=1, metavar="N",
        help="emulated engines only: spread them over N processes, so the emulator's own CPU "
        "does not queue requests on one core (default %(default)s)",
    )
    parser.add_argument(
        "--time-scale", default="1",
        help="emulated engines only: wall seconds per emulated second, e.g. 1/60 (default 1)",
    )
    parser.add_argument(
        "--pool-connector", choices=list(PROFILES), default=DEFAULT_PROFILE,
        help="emulated engines only: whose rules fill and evict their shared DDR pool "
        "(default %(default)s, the bank's stack)",
    )
    parser.add_argument(
        "--roles", type=role_list, default=(), metavar="R1,R2,...",
        help="emulated engines only: one role per engine (both, prefill, decode): a "
        "prefill/decode-disaggregated pool (default: all both)",
    )
    parser.add_argument(
        "--hbm-tokens", type=int, default=DEFAULT_HBM_TOKENS, metavar="N",
        help="emulated engines only: each engine's HBM for KV cache, in tokens; the gate's "
        "placement.engine_cost.hbm_tokens follows it unless the YAML sets it "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--kv-events-port", type=int, default=0, metavar="PORT",
        help="emulated engines only: each publishes vLLM's KV cache events (ZMQ PUB), the "
        "first on PORT, the others on the next ports; 0 = off (default %(default)s)",
    )

def run(args: argparse.Namespace) -> int:
    try:
        # Without pools (or --engines), kvgate up runs an emulated fleet.
        checked = check_file(args.config, require_pools=False) if args.config else None
    except ConfigError as exc:
        return _refused(exc.render(), "kvgate up: configuration rejected; nothing was started")
    config = checked.config if checked is not None else Config()
    if checked is not None:
        report_warnings(args.config, checked.warnings)
    if args.engines:
        try:
            config = with_engines(config, args.engines)
        except ConfigError as exc:
            return _refused(exc.render(), "kvgate up: --engines rejected; nothing was started")
    if config.etcd.endpoints is None and (config.etcd.tls or config.etcd.auth):
        return _refused("kvgate up: etcd.tls and etcd.auth are for the etcd that etcd.endpoints "
                        "names; without endpoints kvgate up starts its own etcd, on loopback, "
                        "without them")
    try:
        if args.ports:
            config = with_ports(config, parse_ports(args.ports))
        if args.upstream_header:
            config = _with_upstream_header(config, args.upstream_header)
    except (PortsError, ConfigError) as exc:
        return _refused(exc.render() if isinstance(exc, ConfigError) else f"kvgate up: {exc}",
                        "kvgate up: nothing was started")
    fleet = _emulated_fleet(config, args) if not config.pools else Fleet(config)
    if isinstance(fleet, str):
        return _refused(f"kvgate up: {fleet}")
    return asyncio.run(_up(fleet, args))


def _refused(*lines: str) -> int:
    """Says on stderr why kvgate up stops; its exit status."""
    for line in lines:
        print(line, file=sys.stderr)
    return 1


@dataclass(frozen=True, slots=True)
class Fleet:
    """The config to run, and, for an emulated fleet, where its engines go."""

    config: Config
    engine_port: int = 0  # the first engine's (0: free ports)
    events: str | None = None  # how its KV events are wired, to say at start
    emulator_args: tuple[str, ...] = ()  # beyond those the flags give


def _emulated_fleet(config: Config, args: argparse.Namespace) -> Fleet | str:
    """The config for an emulated fleet (its engines priced, its KV event streams wired), or
    what is wrong with the flags."""
    if args.emulated < 1:
        return "no engines: configure pools, pass --engines, or --emulated N"
    try:
        scale = time_scale(args.time_scale)
    except argparse.ArgumentTypeError as exc:
        return f"--time-scale: {exc}; nothing was started"
    if not 1 <= args.emulator_processes <= args.emulated:
        return (f"--emulator-processes must be between 1 and --emulated ({args.emulated}), "
                f"got {args.emulator_processes}")
    if args.roles and len(args.roles) != args.emulated:
        return (f"--roles must name one role per emulated engine ({args.emulated}), "
                f"got {len(args.roles)}")
    if args.roles and Role.PREFILL in args.roles and not any(
            Role(r).decodes for r in args.roles):
        return "--roles: prefill engines need at least one engine that decodes"
    if not 0 <= args.kv_events_port <= 65535 - max(0, args.emulated - 1):
        return f"--kv-events-port out of range for {args.emulated} engines: {args.kv_events_port}"
    if args.hbm_tokens < 1:
        return f"--hbm-tokens must be at least 1, got {args.hbm_tokens}"
    config = priced(config, EmulatorOptions(hbm_tokens=args.hbm_tokens), scale)
    if not args.kv_events_port:
        return Fleet(config)
    try:
        ports = event_ports(config, args.kv_events_port, args.emulated)
    except NoFreePorts as exc:
        return f"--kv-events-port: {exc}; nothing was started"
    config, events = with_event_streams(config, args.kv_events_port, ports)
    return Fleet(config, ports.engine_port, events,
                 ("--kv-events-replay-port", str(ports.replay_port)))


def priced(config: Config, engine: EmulatorOptions, scale: float) -> Config:
    """`config`'s gate pricing the emulated `engine`s as they run (their figures, in wall time)
    where the YAML prices none; else the YAML's prices, with the engines' HBM where it sets
    none (`hbm_tokens` at its default): what `load_gate.hbm_estimate: routed` fills."""
    cost = config.placement.engine_cost
    if cost == EngineCost():  # not priced in the YAML
        return replace(config, placement=for_emulated_fleet(config.placement, engine, scale))
    if cost.hbm_tokens != EngineCost().hbm_tokens:
        return config  # the user's HBM
    return replace(config, placement=replace(config.placement, engine_cost=replace(
        cost, hbm_tokens=engine.hbm_tokens)))


def emulator_args(args: argparse.Namespace) -> tuple[str, ...]:
    """What ``kvgate emulate`` is told, beyond its ports, when kvgate up runs the fleet."""
    return ("--time-scale", args.time_scale, "--processes", str(args.emulator_processes),
            "--pool-connector", args.pool_connector,
            "--kv-events-port", str(args.kv_events_port), "--hbm-tokens", str(args.hbm_tokens),
            *(("--roles", ",".join(args.roles)) if args.roles else ()))


def _with_upstream_header(config: Config, name: str) -> Config:
    """Validated as the YAML key is, so a bad name reads the same either way."""
    checked = load_text(yaml.safe_dump({"upstream_header": name}), source="--upstream-header",
                        require_pools=False)
    return replace(config, upstream_header=checked.upstream_header)


def _say(line: str) -> None:
    print(line, flush=True)


async def _up(fleet: Fleet, args: argparse.Namespace) -> int:
    config = fleet.config
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal closed
        loop.add_signal_handler(sig, stop.set)
    workdir, left_behind = workdirs.prepare(args.workdir)
    if left_behind:
        _say(f"kvgate up: removed {len(left_behind)} work directories of runs that were killed")
    stack = Stack(
        config, workdir.path, report=_say,
        emulated_engines=0 if config.pools else args.emulated,
        emulator_args=emulator_args(args) + fleet.emulator_args, port_advice=port_advice(args),
        engine_port=fleet.engine_port,
    )
    if fleet.events:
        _say(fleet.events)
    code = 1
    try:
        code = await _run(stack, stop)
        return code
    finally:
        await stack.stop()  # stopped already unless something unexpected happened
        failed = code not in (0, 130)  # the logs say why: kept
        _say(f"kvgate up: {workdirs.finish(workdir, args.keep_workdir, failed=failed)}")


def port_advice(args: argparse.Namespace) -> str:
    """What to do about a port another program holds, for how this run was told its ports."""
    if args.ports:
        return "use --ports auto, or another --ports base"
    if args.config:
        return f"change it in {args.config}, or use --ports auto"
    return "use --ports auto (every port from the OS) or --ports BASE"


async def _run(stack: Stack, stop: asyncio.Event) -> int:
    _say(f"kvgate up: starting (logs in {stack.workdir})")
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
        return _refused(f"kvgate up: {exc}", "kvgate up: nothing left running")
    _print_ready(stack, await unhealthy_engines(stack.config))
    supervisor = ChildSupervisor(stack, _say)
    gave_up = await supervisor.run(stop)
    await stack.stop()
    if gave_up is not None:
        _report_gave_up(stack, gave_up, supervisor.policy.describe())
        # Everything of ours has stopped: whatever holds one of our ports now is another
        # program's (on a shared host, the usual reason a child cannot come back).
        for name, address, why in await wait_for_ports(stack.listening(), 0.0):
            print(f"kvgate up: {name} {address} is held by another program"
                  + (f": {why}" if why else "") + f" ({stack.port_advice})", file=sys.stderr)
        return 1
    _say("kvgate up: stopped")
    return 0


def _report_gave_up(stack: Stack, gave_up: GaveUp, policy: str) -> None:
    name = gave_up.component.name
    log = gave_up.component.child.log_path if gave_up.component.child else stack.workdir
    print(f"kvgate up: {name} {gave_up.how} and cannot come back ({policy}); everything "
          "stopped", file=sys.stderr)
    print(f"kvgate up: the last lines of {log}:", file=sys.stderr)
    print(gave_up.tail or "  | (empty)", file=sys.stderr)


def _print_ready(stack: Stack, unhealthy: list[Unhealthy]) -> None:
    config = stack.config
    engines = [ep.key for pool in config.pools for ep in pool.endpoints]
    _say("")
    if len(unhealthy) == len(engines):
        _say(f"kvgate is up, but no engine passes its health check: gateway "
             f"http://{config.listener} fails requests until one does")
    else:
        _say(f"kvgate is ready: gateway http://{config.listener}")
    _say(f"  Envoy admin: http://{config.envoy_admin}")
    _say(f"  control plane: xds {config.control_plane.xds}, admin API {config.control_plane.admin}")
    _say(f"  ext_proc: {', '.join(str(a) for a in config.ext_proc.addresses)}, "
         f"metrics http://{config.ext_proc.metrics}/metrics")
    _say(f"  engines: {', '.join(engines)}")
    if unhealthy:
        _say(f"  WARNING: {len(unhealthy)} of {len(engines)} engines fail their health check:")
        for engine in unhealthy:
            _say(f"    {engine.engine}  {engine.reason}")
        _say("    (kvgate status shows what the control plane makes of them)")
    for line in examples(config):
        _say(line)
    admin = config.control_plane.admin
    if os.environ.get(TOKEN_ENV):
        _say(f"  operator token (drain, undrain, fail, move): ${TOKEN_ENV}")
    else:
        _say(f"  operator token (drain, undrain, fail, move): {token_path(admin.port)}")
        _say("    (only you can read it; your kvgate commands use it by themselves)")
    _say("  Ctrl-C stops everything.")


def examples(config: Config) -> list[str]:
    """What to try and how to operate this stack, with its own addresses and header names.

    Which engine served a request: from the opt-in upstream header if the config sets one,
    else from the session's binding (`kvgate sessions show`), which works with any engine."""
    header = config.session.headers[0]
    url = f"http://{config.listener}"
    admin = config.control_plane.admin
    flag = "" if (admin.host, admin.port) == ("127.0.0.1", 18001) else f" --admin {admin}"
    body = ('{"prompt_cache_key": "demo-1", "messages": [{"role": "user", '
            '"content": "hello"}]}')
    curl = (f"    curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n"
            f"      -d '{body}'")
    lines = ["", "  try it: a conversation keeps to the engine holding its KV cache, whether it "
             "names", "  itself in the body (prompt_cache_key), in a header, or not at all:"]
    if config.upstream_header:
        lines.append(f"{curl} -i | grep -i {config.upstream_header}")
    else:
        lines += [curl, f"    kvgate sessions show demo-1{flag}      (the engine it is bound to)"]
    lines.append(
        f"    python -c \"import openai; c = openai.OpenAI(base_url='{url}/v1', api_key='-'); "
        f"m = c.models.list().data[0].id; print(c.chat.completions.create(model=m, "
        f"messages=[{{'role': 'user', 'content': 'hi'}}], "
        f"extra_headers={{'{header}': 'demo-1'}}).usage)\"")
    lines += ["  four turns with the openai client; cached tokens grow turn by turn:",
              "    python - <<'EOF'", *openai_example(url, header), "EOF"]
    lines += [
        "",
        "  operate it:" + (f"  (or export KVGATE_ADMIN={admin})" if flag else ""),
        f"    kvgate status{flag}",
        f"    kvgate endpoints list{flag}      (drain | undrain | fail ADDRESS)",
        f"    kvgate sessions list{flag}       (show SESSION | move SESSION ENDPOINT)",
    ]
    return lines


def openai_example(url: str, header: str) -> list[str]:
    """A script (unindented, for `python -`) of one conversation keyed by prompt_cache_key."""
    return [
        "import openai",
        f"client = openai.OpenAI(base_url='{url}/v1', api_key='-')",
        "model = client.models.list().data[0].id",
        "code = 'def handler(event):\\n    return event\\n' * 100  # a long prompt caches well",
        "messages = [{'role': 'system', 'content': 'You review this code:\\n' + code}]",
        "for turn in range(4):",
        "    messages.append({'role': 'user', 'content': f'Question {turn}: what can fail?'})",
        "    reply = client.chat.completions.create(",
        "        model=model, messages=messages, max_tokens=32,",
        "        prompt_cache_key='demo-conversation-1')  # OpenAI's field; or a header:",
        f"        # extra_headers={{'{header}': 'demo-conversation-1'}}",
        "    messages.append({'role': 'assistant', 'content': reply.choices[0].message.content})",
        "    cached = getattr(reply.usage.prompt_tokens_details, 'cached_tokens', 0)",
        "    print(f'turn {turn}: {reply.usage.prompt_tokens} prompt tokens, {cached} cached')",
    ]
