from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchFleetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineLoad(_message.Message):
    __slots__ = ("endpoint", "waiting", "running", "kv_usage", "age_s")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    waiting: int
    running: int
    kv_usage: float
    age_s: float
    def __init__(self, endpoint: _Optional[str] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., age_s: _Optional[float] = ...) -> None: ...

class EngineLoads(_message.Message):
    __slots__ = ("endpoint", "waiting", "running", "kv_usage", "age_s", "eviction_rate")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    EVICTION_RATE_FIELD_NUMBER: _ClassVar[int]
    endpoint: _containers.RepeatedScalarFieldContainer[str]
    waiting: _containers.RepeatedScalarFieldContainer[int]
    running: _containers.RepeatedScalarFieldContainer[int]
    kv_usage: _containers.RepeatedScalarFieldContainer[float]
    age_s: _containers.RepeatedScalarFieldContainer[float]
    eviction_rate: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, endpoint: _Optional[_Iterable[str]] = ..., waiting: _Optional[_Iterable[int]] = ..., running: _Optional[_Iterable[int]] = ..., kv_usage: _Optional[_Iterable[float]] = ..., age_s: _Optional[_Iterable[float]] = ..., eviction_rate: _Optional[_Iterable[float]] = ...) -> None: ...

class SessionResidency(_message.Message):
    __slots__ = ("endpoint", "session", "tokens", "unknown", "stored")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    session: str
    tokens: int
    unknown: bool
    stored: int
    def __init__(self, endpoint: _Optional[str] = ..., session: _Optional[str] = ..., tokens: _Optional[int] = ..., unknown: _Optional[bool] = ..., stored: _Optional[int] = ...) -> None: ...

class FleetLoad(_message.Message):
    __slots__ = ("round", "interval_s", "collector", "engines", "residency", "residency_full", "residency_lost", "loads")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTOR_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FULL_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_LOST_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    round: int
    interval_s: float
    collector: str
    engines: _containers.RepeatedCompositeFieldContainer[EngineLoad]
    residency: _containers.RepeatedCompositeFieldContainer[SessionResidency]
    residency_full: bool
    residency_lost: _containers.RepeatedScalarFieldContainer[str]
    loads: EngineLoads
    def __init__(self, round: _Optional[int] = ..., interval_s: _Optional[float] = ..., collector: _Optional[str] = ..., engines: _Optional[_Iterable[_Union[EngineLoad, _Mapping]]] = ..., residency: _Optional[_Iterable[_Union[SessionResidency, _Mapping]]] = ..., residency_full: _Optional[bool] = ..., residency_lost: _Optional[_Iterable[str]] = ..., loads: _Optional[_Union[EngineLoads, _Mapping]] = ...) -> None: ...

class FleetCollectorStatus(_message.Message):
    __slots__ = ("collecting", "engines", "watchers", "interval_s", "rounds")
    COLLECTING_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    WATCHERS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    collecting: bool
    engines: int
    watchers: int
    interval_s: float
    rounds: int
    def __init__(self, collecting: _Optional[bool] = ..., engines: _Optional[int] = ..., watchers: _Optional[int] = ..., interval_s: _Optional[float] = ..., rounds: _Optional[int] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("pool", "address", "kv_pool", "weight", "admin", "healthy", "state", "drain_deadline", "role", "source", "left_at")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KV_POOL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LEFT_AT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    address: str
    kv_pool: str
    weight: int
    admin: str
    healthy: bool
    state: str
    drain_deadline: float
    role: str
    source: str
    left_at: float
    def __init__(self, pool: _Optional[str] = ..., address: _Optional[str] = ..., kv_pool: _Optional[str] = ..., weight: _Optional[int] = ..., admin: _Optional[str] = ..., healthy: _Optional[bool] = ..., state: _Optional[str] = ..., drain_deadline: _Optional[float] = ..., role: _Optional[str] = ..., source: _Optional[str] = ..., left_at: _Optional[float] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("running", "waiting", "kv_cache_usage", "hit_rate", "backlog_s")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_S_FIELD_NUMBER: _ClassVar[int]
    running: float
    waiting: float
    kv_cache_usage: float
    hit_rate: float
    backlog_s: float
    def __init__(self, running: _Optional[float] = ..., waiting: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., hit_rate: _Optional[float] = ..., backlog_s: _Optional[float] = ...) -> None: ...

class EndpointStatus(_message.Message):
    __slots__ = ("endpoint", "sessions", "load", "held")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    sessions: int
    load: Load
    held: str
    def __init__(self, endpoint: _Optional[_Union[Endpoint, _Mapping]] = ..., sessions: _Optional[int] = ..., load: _Optional[_Union[Load, _Mapping]] = ..., held: _Optional[str] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints", "sessions_note")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_NOTE_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointStatus]
    sessions_note: str
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointStatus, _Mapping]]] = ..., sessions_note: _Optional[str] = ...) -> None: ...

class DrainEndpointRequest(_message.Message):
    __slots__ = ("address", "pool", "deadline_seconds")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    address: str
    pool: str
    deadline_seconds: float
    def __init__(self, address: _Optional[str] = ..., pool: _Optional[str] = ..., deadline_seconds: _Optional[float] = ...) -> None: ...

class DrainEndpointResponse(_message.Message):
    __slots__ = ("endpoint",)
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    def __init__(self, endpoint: _Optional[_Union[Endpoint, _Mapping]] = ...) -> None: ...

class UndrainEndpointRequest(_message.Message):
    __slots__ = ("address", "pool")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    address: str
    pool: str
    def __init__(self, address: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class UndrainEndpointResponse(_message.Message):
    __slots__ = ("endpoint",)
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    def __init__(self, endpoint: _Optional[_Union[Endpoint, _Mapping]] = ...) -> None: ...

class FailEndpointRequest(_message.Message):
    __slots__ = ("address", "pool")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    address: str
    pool: str
    def __init__(self, address: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class FailEndpointResponse(_message.Message):
    __slots__ = ("endpoint",)
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    endpoint: Endpoint
    def __init__(self, endpoint: _Optional[_Union[Endpoint, _Mapping]] = ...) -> None: ...

class SessionBinding(_message.Message):
    __slots__ = ("session", "pool", "endpoint", "revision", "lease", "moved_at", "move_reason", "move_terms", "stay_s", "last_turn")
    class MoveTermsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MOVED_AT_FIELD_NUMBER: _ClassVar[int]
    MOVE_REASON_FIELD_NUMBER: _ClassVar[int]
    MOVE_TERMS_FIELD_NUMBER: _ClassVar[int]
    STAY_S_FIELD_NUMBER: _ClassVar[int]
    LAST_TURN_FIELD_NUMBER: _ClassVar[int]
    session: str
    pool: str
    endpoint: str
    revision: int
    lease: int
    moved_at: float
    move_reason: str
    move_terms: _containers.ScalarMap[str, float]
    stay_s: float
    last_turn: PdTurn
    def __init__(self, session: _Optional[str] = ..., pool: _Optional[str] = ..., endpoint: _Optional[str] = ..., revision: _Optional[int] = ..., lease: _Optional[int] = ..., moved_at: _Optional[float] = ..., move_reason: _Optional[str] = ..., move_terms: _Optional[_Mapping[str, float]] = ..., stay_s: _Optional[float] = ..., last_turn: _Optional[_Union[PdTurn, _Mapping]] = ...) -> None: ...

class PdTurn(_message.Message):
    __slots__ = ("path", "decode", "prefill", "lacking_tokens", "at")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    LACKING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    path: str
    decode: str
    prefill: str
    lacking_tokens: int
    at: float
    def __init__(self, path: _Optional[str] = ..., decode: _Optional[str] = ..., prefill: _Optional[str] = ..., lacking_tokens: _Optional[int] = ..., at: _Optional[float] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("pool", "endpoint", "limit", "after")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    pool: str
    endpoint: str
    limit: int
    after: str
    def __init__(self, pool: _Optional[str] = ..., endpoint: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_after")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionBinding]
    next_after: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionBinding, _Mapping]]] = ..., next_after: _Optional[str] = ...) -> None: ...

class ShowSessionRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class ShowSessionResponse(_message.Message):
    __slots__ = ("bindings",)
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[SessionBinding]
    def __init__(self, bindings: _Optional[_Iterable[_Union[SessionBinding, _Mapping]]] = ...) -> None: ...

class MoveSessionRequest(_message.Message):
    __slots__ = ("session", "endpoint", "pool")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    session: str
    endpoint: str
    pool: str
    def __init__(self, session: _Optional[str] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class MoveSessionResponse(_message.Message):
    __slots__ = ("binding",)
    BINDING_FIELD_NUMBER: _ClassVar[int]
    binding: SessionBinding
    def __init__(self, binding: _Optional[_Union[SessionBinding, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "cluster", "connected_at", "acked", "nacks", "last_nack", "last_nack_version")
    class AckedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    LAST_NACK_FIELD_NUMBER: _ClassVar[int]
    LAST_NACK_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster: str
    connected_at: float
    acked: _containers.ScalarMap[str, str]
    nacks: int
    last_nack: str
    last_nack_version: str
    def __init__(self, node_id: _Optional[str] = ..., cluster: _Optional[str] = ..., connected_at: _Optional[float] = ..., acked: _Optional[_Mapping[str, str]] = ..., nacks: _Optional[int] = ..., last_nack: _Optional[str] = ..., last_nack_version: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("identity", "leader", "config_version", "config_source", "nodes", "last_reload_error", "endpoints", "endpoints_error", "failing_tasks", "etcd_errors", "etcd_alarms", "membership_generation", "membership_warning", "mirrors", "ext_procs", "etcd_db_bytes", "etcd_db_in_use_bytes", "sessions_note", "fleet_collector", "discovery")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SOURCE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    LAST_RELOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILING_TASKS_FIELD_NUMBER: _ClassVar[int]
    ETCD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ETCD_ALARMS_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_GENERATION_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_WARNING_FIELD_NUMBER: _ClassVar[int]
    MIRRORS_FIELD_NUMBER: _ClassVar[int]
    EXT_PROCS_FIELD_NUMBER: _ClassVar[int]
    ETCD_DB_BYTES_FIELD_NUMBER: _ClassVar[int]
    ETCD_DB_IN_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_NOTE_FIELD_NUMBER: _ClassVar[int]
    FLEET_COLLECTOR_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_FIELD_NUMBER: _ClassVar[int]
    identity: str
    leader: str
    config_version: str
    config_source: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    last_reload_error: str
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointStatus]
    endpoints_error: str
    failing_tasks: _containers.RepeatedCompositeFieldContainer[TaskFailure]
    etcd_errors: _containers.RepeatedCompositeFieldContainer[EtcdErrorSeen]
    etcd_alarms: _containers.RepeatedScalarFieldContainer[str]
    membership_generation: int
    membership_warning: str
    mirrors: _containers.RepeatedCompositeFieldContainer[MirrorStatus]
    ext_procs: _containers.RepeatedCompositeFieldContainer[ExtProcStatus]
    etcd_db_bytes: int
    etcd_db_in_use_bytes: int
    sessions_note: str
    fleet_collector: FleetCollectorStatus
    discovery: _containers.RepeatedCompositeFieldContainer[DiscoverySource]
    def __init__(self, identity: _Optional[str] = ..., leader: _Optional[str] = ..., config_version: _Optional[str] = ..., config_source: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., last_reload_error: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[EndpointStatus, _Mapping]]] = ..., endpoints_error: _Optional[str] = ..., failing_tasks: _Optional[_Iterable[_Union[TaskFailure, _Mapping]]] = ..., etcd_errors: _Optional[_Iterable[_Union[EtcdErrorSeen, _Mapping]]] = ..., etcd_alarms: _Optional[_Iterable[str]] = ..., membership_generation: _Optional[int] = ..., membership_warning: _Optional[str] = ..., mirrors: _Optional[_Iterable[_Union[MirrorStatus, _Mapping]]] = ..., ext_procs: _Optional[_Iterable[_Union[ExtProcStatus, _Mapping]]] = ..., etcd_db_bytes: _Optional[int] = ..., etcd_db_in_use_bytes: _Optional[int] = ..., sessions_note: _Optional[str] = ..., fleet_collector: _Optional[_Union[FleetCollectorStatus, _Mapping]] = ..., discovery: _Optional[_Iterable[_Union[DiscoverySource, _Mapping]]] = ...) -> None: ...

class DiscoverySource(_message.Message):
    __slots__ = ("pool", "source", "engines", "age_seconds", "error")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    pool: str
    source: str
    engines: int
    age_seconds: float
    error: str
    def __init__(self, pool: _Optional[str] = ..., source: _Optional[str] = ..., engines: _Optional[int] = ..., age_seconds: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class MirrorStatus(_message.Message):
    __slots__ = ("replica", "name", "state", "since", "revision", "relists", "error")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RELISTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    replica: str
    name: str
    state: str
    since: float
    revision: int
    relists: int
    error: str
    def __init__(self, replica: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., since: _Optional[float] = ..., revision: _Optional[int] = ..., relists: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ExtProcStatus(_message.Message):
    __slots__ = ("identity", "reported_at", "bindings", "pending", "degraded", "unbound", "load_source", "load_age_s", "collector_reachable")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    UNBOUND_FIELD_NUMBER: _ClassVar[int]
    LOAD_SOURCE_FIELD_NUMBER: _ClassVar[int]
    LOAD_AGE_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTOR_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    identity: str
    reported_at: float
    bindings: int
    pending: int
    degraded: bool
    unbound: int
    load_source: str
    load_age_s: float
    collector_reachable: bool
    def __init__(self, identity: _Optional[str] = ..., reported_at: _Optional[float] = ..., bindings: _Optional[int] = ..., pending: _Optional[int] = ..., degraded: _Optional[bool] = ..., unbound: _Optional[int] = ..., load_source: _Optional[str] = ..., load_age_s: _Optional[float] = ..., collector_reachable: _Optional[bool] = ...) -> None: ...

class TaskFailure(_message.Message):
    __slots__ = ("task", "restarts", "error", "failed_at")
    TASK_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_FIELD_NUMBER: _ClassVar[int]
    task: str
    restarts: int
    error: str
    failed_at: float
    def __init__(self, task: _Optional[str] = ..., restarts: _Optional[int] = ..., error: _Optional[str] = ..., failed_at: _Optional[float] = ...) -> None: ...

class EtcdErrorSeen(_message.Message):
    __slots__ = ("kind", "count", "error", "last_at")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_AT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    count: int
    error: str
    last_at: float
    def __init__(self, kind: _Optional[str] = ..., count: _Optional[int] = ..., error: _Optional[str] = ..., last_at: _Optional[float] = ...) -> None: ...
