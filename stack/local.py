"""The gateway stack as child processes: etcd (embedded unless configured) → control plane →
ext_proc replicas → Envoy. Started in that order, each waited for; stopped in reverse.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control_plane.resources.bootstrap import ads_bootstrap, static_bootstrap, to_json
from kvgate.config.dump import to_yaml
from kvgate.config.load import with_default_routes
from kvgate.config.model import Config, Endpoint, Etcd, HostPort, Pool
from kvgate.contract.modes import RoutingMode
from kvgate.contract.states import Role
from kvgate.runtime.children.child import Child, ChildFailed
from kvgate.runtime.children.envoy import envoy_child, envoy_ready, envoy_serving
from kvgate.runtime.children.etcd import embedded_etcd, etcd_ready
from kvgate.runtime.children.port_owner import TIME_WAIT_S
from kvgate.runtime.children.ports import free_ports, wait_for_ports
from stack.emulated import emulator_child, with_engine_ports, written


@dataclass
class Component:
    name: str
    where: str
    child: Child | None = None
    # Says when the child serves again (a restart waits for it as the start did).
    probe: Callable[[], Awaitable[bool]] | None = None


@dataclass
class Stack:
    config: Config
    workdir: Path
    report: Callable[[str], None] = lambda line: None
    ready_timeout: float = 30.0
    # What a port clash message advises (kvgate up: --ports auto, or the YAML when one was given).
    port_advice: str = "change it in the YAML"
    # How long a port held only by a closed connection in TIME-WAIT is waited for.
    time_wait_s: float = TIME_WAIT_S
    # Baseline modes are Envoy alone (no etcd, control plane or ext_proc): for comparisons.
    mode: RoutingMode = RoutingMode.AFFINITY
    # With no pools configured: this many emulated engines sharing one DDR pool (`kvgate emulate`).
    emulated_engines: int = 0
    emulator_args: tuple[str, ...] = ()
    # The first emulated engine's port, the others on the next ones (0: free ports).
    engine_port: int = 0
    envoy_workers: int = 2
    # The embedded etcd's client and peer ports (default: free ones from the OS).
    etcd_ports: tuple[int, int] | None = None
    # Etcd endpoints that one component uses instead of the cluster's, by its name (e.g.
    # "ext_proc[1]"): a fault test puts a proxy it can cut between that component and etcd.
    etcd_for: dict[str, list[str]] = field(default_factory=dict)
    # Environment one component's process gets on top of this one's, by its name (a fault test
    # sets one replica's wall clock off).
    env_for: dict[str, dict[str, str]] = field(default_factory=dict)
    # Where Envoy asks for its config, instead of the control plane's xDS address (a fault test's
    # proxy, as above).
    envoy_xds: HostPort | None = None
    # Envoy's hot restart, on this base id (None: off). hot_restart_envoy() then replaces it.
    envoy_base_id: int | None = None
    _envoy_epoch: int = 0
    fleet: Child | None = None
    _fleet_ready: Path = Path()
    components: list[Component] = field(default_factory=list)
    ext_procs: list[Child] = field(default_factory=list)
    # Each ext_proc replica's metrics address, in the order of `ext_procs`.
    ext_proc_metrics: list[HostPort] = field(default_factory=list)
    envoy: Child | None = None
    etcd: Child | None = None
    control_plane: Child | None = None

    @property
    def etcd_endpoints(self) -> list[str]:
        return [str(e) for e in self.config.etcd.endpoints or ()]

    def _etcd_of(self, component: str) -> str:
        return ",".join(self.etcd_for.get(component, self.etcd_endpoints))

    async def start(self) -> None:
        """Starts everything or nothing: on any failure what was started is stopped again."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self._check_ports()
        try:
            if self.emulated_engines and not self.config.pools:
                await self._start_fleet()
            if self.mode.uses_ext_proc:
                await self._start_etcd()
                await self._start_control_plane()
                for index, address in enumerate(self.config.ext_proc.addresses):
                    await self._start_ext_proc(index, address)
            await self._start_envoy()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for component in reversed(self.components):
            if component.child is not None:
                await component.child.stop()
        self.components.clear()

    def _own_ports(self) -> set[int]:
        """The ports the config promises to the stack's services (maybe taken from the OS and
        released again, as `kvgate up --ports auto` does): never to be handed out twice."""
        return config_ports(self.config)

    def listening(self) -> list[tuple[str, HostPort]]:
        """The ports the stack's own servers listen on, each with what listens there."""
        wanted = [
            ("gateway listener", self.config.listener),
            ("Envoy admin", self.config.envoy_admin),
        ]
        if self.mode.uses_ext_proc:
            wanted += [
                ("control-plane admin", self.config.control_plane.admin),
                ("control-plane xds", self.config.control_plane.xds),
                *(("ext_proc", a) for a in self.config.ext_proc.addresses),
            ]
        return wanted

    async def _check_ports(self) -> None:
        """Refuses ports another program holds, naming it where /proc tells; waits (at most
        `time_wait_s`) for one that only a closed connection holds in TIME-WAIT."""
        busy = await wait_for_ports(self.listening(), self.time_wait_s, self.report)
        if busy:
            held = [f"{name} {addr}" + (f" (held {why})" if why else "")
                    for name, addr, why in busy]
            raise ChildFailed(f"port already in use: {'; '.join(held)} ({self.port_advice})")

    async def _start_fleet(self) -> None:
        child, ready = emulator_child(self.emulated_engines, self.emulator_args, self.workdir,
                                      self.engine_port)
        await self._launch(child, f"{self.emulated_engines} emulated vLLM engines + DDR pool",
                           written(ready))
        fleet = json.loads(ready.read_text())
        # A restart takes the same ports: the engines keep their addresses in the pool.
        child.argv = with_engine_ports(child.argv, [HostPort.parse(a).port
                                                    for a in fleet["engines"]])
        self._fleet_ready = ready
        roles = [Role(r) for r in fleet.get("roles", ())] or [Role.BOTH] * len(fleet["engines"])
        pool = Pool(
            name="default",
            kv_pool="ddr-pool" if fleet.get("pool_url") else "none",
            endpoints=tuple(
                Endpoint(HostPort.parse(address), "ddr-pool" if fleet.get("pool_url") else
                         f"hbm-{i}", role=roles[i])
                for i, address in enumerate(fleet["engines"])
            ),
        )
        # The emulated fleet serves what real engines would: the inference API only.
        self.config = with_default_routes(replace(self.config, pools=(pool,), routes=()))
        self.fleet = child
        self.report(f"  {'':<12}        engines {', '.join(fleet['engines'])}; "
                    f"DDR pool {fleet.get('pool_url')}")

    async def _start_etcd(self) -> None:
        if self.config.etcd.endpoints is not None:
            return
        client_port, peer_port = self.etcd_ports or free_ports(2, exclude=self._own_ports())
        child = embedded_etcd(
            self.workdir / "etcd-data", client_port, peer_port, self.workdir / "etcd.log"
        )
        endpoint = HostPort("127.0.0.1", client_port)
        self.config = replace(self.config, etcd=Etcd((endpoint,), self.config.etcd.prefix))
        await self._launch(child, f"http://{endpoint} (embedded, data in {self.workdir})",
                           lambda: etcd_ready(str(endpoint)))
        self.etcd = child

    async def _start_control_plane(self) -> None:
        admin = self.config.control_plane.admin
        child = Child(
            "control-plane",
            [
                sys.executable, "-m", "control_plane", "-c", str(self._write_config()),
                "--etcd", self._etcd_of("control-plane"),
            ],
            self.workdir / "control-plane.log",
            self.env_for.get("control-plane"),
        )
        xds = self.config.control_plane.xds
        await self._launch(child, f"xds grpc://{xds}  admin grpc://{admin}",
                           lambda: grpc_serving(admin))
        self.control_plane = child

    def _write_config(self) -> Path:
        path = self.workdir / "kvgate.effective.yaml"
        path.write_text(to_yaml(self.config))
        return path

    async def _start_ext_proc(self, index: int, address: HostPort) -> None:
        config_path = self._write_config()
        metrics = self.config.ext_proc.metrics
        if index > 0:
            port = free_ports(1, metrics.host, exclude=self._own_ports())[0]
            metrics = HostPort(metrics.host, port)
        name = f"ext_proc[{index}]" if len(self.config.ext_proc.addresses) > 1 else "ext_proc"
        child = Child(
            name,
            [
                sys.executable, "-m", "ext_proc", "-c", str(config_path),
                "--listen", str(address), "--metrics", str(metrics),
                "--etcd", self._etcd_of(name),
            ],
            self.workdir / f"ext_proc-{index}.log",
            self.env_for.get(name),
        )
        if self.config.ext_proc.transport == "http":
            scheme, probe = "http", http_serving
        else:
            scheme, probe = "grpc", grpc_serving
        await self._launch(child, f"{scheme}://{address}  metrics http://{metrics}/metrics",
                           lambda: probe(address))
        self.ext_procs.append(child)
        self.ext_proc_metrics.append(metrics)

    async def _start_envoy(self) -> None:
        bootstrap = self.workdir / "envoy.json"
        if self.mode.uses_ext_proc:  # everything else arrives over ADS
            document = ads_bootstrap(self.config,
                                     xds=None if self.envoy_xds is None else [self.envoy_xds])
        else:
            document = static_bootstrap(self.config, mode=self.mode)
        bootstrap.write_text(to_json(document))
        child = envoy_child(bootstrap, self.workdir / "envoy.log", self.envoy_workers,
                            None if self.envoy_base_id is None
                            else (self.envoy_base_id, self._envoy_epoch))
        await self._launch(
            child,
            f"http://{self.config.listener}  admin http://{self.config.envoy_admin}",
            lambda: envoy_serving(self.config.envoy_admin, self.config.listener),
        )
        self.envoy = child

    async def hot_restart_envoy(self) -> None:
        """A new Envoy takes the listeners over from the running one, which drains its
        connections and exits (``--drain-time-s``, ``--parent-shutdown-time-s``): the way Envoy
        is upgraded without closing its port. Needs ``envoy_base_id``."""
        if self.envoy_base_id is None or self.envoy is None:
            raise RuntimeError("hot restart needs envoy_base_id and a running Envoy")
        old = self.envoy
        self._envoy_epoch += 1
        bootstrap = self.workdir / "envoy.json"
        child = envoy_child(bootstrap, self.workdir / f"envoy-{self._envoy_epoch}.log",
                            self.envoy_workers, (self.envoy_base_id, self._envoy_epoch))
        await self._launch(child, f"http://{self.config.listener} (epoch {self._envoy_epoch})",
                           lambda: envoy_ready(self.config.envoy_admin))
        self.envoy = child
        await old.wait_exit(self.ready_timeout)
        self.components = [c for c in self.components if c.child is not old]

    async def _launch(
        self, child: Child, where: str, probe: Callable[[], Awaitable[bool]]
    ) -> None:
        self.report(f"  starting {child.name} ...")
        component = Component(child.name, where, child, probe)
        self.components.append(component)
        await child.start()
        await child.wait_ready(probe, self.ready_timeout)
        self.report(f"  {child.name:<12} ready  {where}  (pid {child.pid})")

    async def restart(self, component: Component) -> None:
        """Starts a child that exited again, with the same command line (so the same ports,
        config and data directory), and waits until it serves; ChildFailed if it does not.
        Its state comes back from etcd (the services) or its data directory (etcd)."""
        child, probe = component.child, component.probe
        if child is None or probe is None:
            raise ValueError(f"{component.name} is not a child this stack started")
        child.kill()  # whatever its process group left behind (an emulator's workers)
        if child is self.fleet:
            self._fleet_ready.unlink(missing_ok=True)
        await child.start()
        await child.wait_ready(probe, self.ready_timeout)


async def grpc_serving(address: HostPort) -> bool:
    async with grpc.aio.insecure_channel(str(address)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        # types-grpcio-health-checking's HealthStub omits the methods its __init__ sets.
        reply: health_pb2.HealthCheckResponse = await stub.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(), timeout=0.5
        )
        return reply.status == health_pb2.HealthCheckResponse.SERVING


async def http_serving(address: HostPort) -> bool:
    """ext_proc's HTTP transport answers a GET (Envoy's health check) with 200 once serving."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(address.host, address.port), 0.5
    )
    try:
        writer.write(b"GET /health HTTP/1.1\r\nhost: ext-proc\r\ncontent-length: 0\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 0.5)
        return status.startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


def config_ports(c: Config) -> set[int]:
    """The ports a config promises to the stack's services."""
    return {a.port for a in (c.listener, c.envoy_admin, c.control_plane.xds,
                             c.control_plane.admin, c.ext_proc.metrics, *c.ext_proc.addresses)}
