"""The validated configuration: immutable values, defaults in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgate.placement.cost import EngineCost
from kvgate.placement.gate import GateConfig


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Health:
    path: str = "/health"
    interval: float = 2.0
    timeout: float = 1.0
    unhealthy_threshold: int = 3
    healthy_threshold: int = 2
    # Probes never mark more than this share of a pool failed (Envoy's max_ejection_percent):
    # past it, an engine they call dead keeps routing, since the prober is more likely wrong.
    max_failed_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: HostPort
    kv_pool: str
    weight: int = 1

    @property
    def key(self) -> str:
        """The `ip:port` form Envoy uses for the host and for override_host."""
        return str(self.address)


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    kv_pool: str
    endpoints: tuple[Endpoint, ...]
    health: Health = field(default_factory=Health)


@dataclass(frozen=True, slots=True)
class RouteMatch:
    prefix: str = "/"
    headers: tuple[tuple[str, str], ...] = ()
    path: str | None = None  # an exact path (query ignored); when set, `prefix` is not used

    @property
    def describe(self) -> str:
        return self.path if self.path is not None else f"{self.prefix}*"


@dataclass(frozen=True, slots=True)
class Route:
    match: RouteMatch
    pool: str
    timeout: float = 0.0


# Without `routes:`, a one-pool gateway serves these and nothing else (docs/operating.md,
# "Routes"): the OpenAI-compatible inference API as vLLM serves it. Not its /metrics, /health,
# /tokenize, profiling, sleep, LoRA loading (/v1/load_lora_adapter is under /v1/ too) or any
# admin path.
INFERENCE_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/models",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/rerank",
    "/v1/score",
)
# Sub-resources: GET /v1/responses/{id}, POST /v1/responses/{id}/cancel.
INFERENCE_PREFIXES = ("/v1/responses/",)


def inference_routes(pool: str) -> tuple[Route, ...]:
    """The default route table for one pool: exactly the inference API, each without timeout."""
    return (
        *(Route(RouteMatch(path=path), pool) for path in INFERENCE_PATHS),
        *(Route(RouteMatch(prefix=prefix), pool) for prefix in INFERENCE_PREFIXES),
    )


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd (`etcd.tls`): absolute paths of PEM files, checked when the config is read."""

    ca: str | None = None  # the CA that signed etcd's certificate; None: the system's CAs
    cert: str | None = None  # a client certificate (chain) and its key: client-certificate auth
    key: str | None = None


@dataclass(frozen=True, slots=True)
class EtcdAuth:
    """etcd user authentication (`etcd.auth`). The password itself is never in the config: it is
    read from `password_file`, else from the KVGATE_ETCD_PASSWORD environment variable."""

    username: str
    password_file: str | None = None  # an absolute path


@dataclass(frozen=True, slots=True)
class Etcd:
    endpoints: tuple[HostPort, ...] | None = None  # None: `kvgate up` starts an embedded etcd
    prefix: str = "/kvgate/v1/"
    tls: EtcdTls | None = None  # None: plaintext
    auth: EtcdAuth | None = None  # None: no user (etcd without authentication)


@dataclass(frozen=True, slots=True)
class Session:
    headers: tuple[str, ...] = ("x-session-id",)
    idle_ttl: float = 3600.0
    # JSON body fields (dotted paths) Envoy reads when no header carries a session.
    body_fields: tuple[str, ...] = ("prompt_cache_key", "user", "metadata.session_id")
    # With no id anywhere: a conversation key from the prompt's leading content (Envoy, Lua).
    implicit: bool = True
    # Bodies up to this size are read for the two above; larger ones pass through unread.
    body_limit: int = 4 * 1024 * 1024
    # Per pool. Past it new sessions are routed on Envoy's ring without a binding; existing
    # bindings are never evicted. 0: no cap. A million is ~200 MB per ext_proc replica.
    max_bindings: int = 1_000_000


_GATE = GateConfig()  # its defaults are the YAML's


@dataclass(frozen=True, slots=True)
class LoadGateConfig:
    """`placement.load_gate`: the gate's thresholds (kvgate.placement.gate.GateConfig) and how
    ext_proc feeds it (live load from the engines' metrics, prompt size from content-length)."""

    enabled: bool = True  # false: static stickiness, exactly as before the gate
    min_saving_s: float = _GATE.min_saving_s
    min_saving_ratio: float = _GATE.min_saving_ratio
    cooldown_s: float = _GATE.cooldown_s
    candidates: int = _GATE.candidates
    miss_safe: bool = _GATE.miss_safe  # move only if no slower should the pool have lost it
    refresh_s: float = 0.1  # how often each ext_proc replica scrapes every active engine
    max_load_age_s: float = 2.0  # an engine's report older than this counts for nothing
    bytes_per_token: float = 4.0  # request body bytes per prompt token (content-length)

    def gate(self) -> GateConfig:
        return GateConfig(self.enabled, self.min_saving_s, self.min_saving_ratio,
                          self.cooldown_s, self.candidates, self.miss_safe)


@dataclass(frozen=True, slots=True)
class Placement:
    load_factor: float = 1.25
    load_gate: LoadGateConfig = field(default_factory=LoadGateConfig)
    engine_cost: EngineCost = field(default_factory=EngineCost)  # the engines' speed


@dataclass(frozen=True, slots=True)
class ExtProc:
    # Envoy balances over every address listed; `kvgate ext-proc` listens on the first by default.
    addresses: tuple[HostPort, ...] = (HostPort("127.0.0.1", 9002),)
    metrics: HostPort = HostPort("127.0.0.1", 9003)
    message_timeout: float = 0.2
    # How Envoy's ext_proc filter reaches the service: "grpc" (the ext_proc contract) or
    # "http" (Envoy's http_service: JSON over HTTP/1.1, far cheaper per decision, but marked
    # work in progress and outside Envoy's threat model).
    transport: str = "grpc"
    # Bindings waiting for etcd while it is away; past it new sessions route on Envoy's ring.
    max_pending_bindings: int = 100_000

    @property
    def etcd_write_deadline(self) -> float:
        """How long a request may wait for its new binding's etcd write before it is queued
        instead: half of Envoy's wait for the decision (the rest is for the gRPC round trip and
        the decision), at most 100 ms (a slower etcd is treated as away)."""
        return min(0.1, self.message_timeout / 2)


@dataclass(frozen=True, slots=True)
class ControlPlane:
    xds: HostPort = HostPort("127.0.0.1", 18000)
    admin: HostPort = HostPort("127.0.0.1", 18001)


@dataclass(frozen=True, slots=True)
class Config:
    listener: HostPort = HostPort("127.0.0.1", 8080)
    envoy_admin: HostPort = HostPort("127.0.0.1", 9901)
    control_plane: ControlPlane = field(default_factory=ControlPlane)
    ext_proc: ExtProc = field(default_factory=ExtProc)
    etcd: Etcd = field(default_factory=Etcd)
    session: Session = field(default_factory=Session)
    placement: Placement = field(default_factory=Placement)
    pools: tuple[Pool, ...] = ()
    routes: tuple[Route, ...] = ()
    # Response header naming the engine (`ip:port`) that served the request; None = off,
    # the default, since it reveals internal addresses to clients.
    upstream_header: str | None = None

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)
