"""Options of an emulated fleet, shared by the CLI and the in-process Fleet."""

from __future__ import annotations

from dataclasses import dataclass

from emulator.engine_model import EngineConfig
from emulator.pool_faults import PoolWindow
from emulator.pool_profiles import DEFAULT_PROFILE, PROFILES, PoolProfile
from emulator.timing import CPU_MAX_NUM_BATCHED_TOKENS, FCFS, SCHEDULERS, TimingParams
from emulator.transfer import TransferParams
from kvgate.contract.states import Role

DEFAULT_MODEL = "Qwen/Qwen2.5-32B-Instruct"
DEFAULT_HBM_TOKENS = 550_000
# Qwen2.5-32B-Instruct's context as vLLM serves it by default: its config's
# max_position_embeddings (131,072 with the YaRN rope scaling Qwen documents for long inputs).
DEFAULT_MAX_MODEL_LEN = 32_768
ROLES = tuple(r.value for r in Role)
DDR_POOL_FLEET_MULTIPLE = 8  # default pool = 8 x the fleet's HBM (DESIGN.md: 5-10x)


@dataclass(slots=True)
class EmulatorOptions:
    """Everything ``kvgate emulate`` accepts; defaults are the published figures in DESIGN.md."""

    instances: int = 1
    host: str = "127.0.0.1"
    port: int = 0  # first instance's port, the others follow; 0 = any free ports
    ports: tuple[int, ...] = ()  # or one port per instance, in order (instead of `port`)
    model: str = DEFAULT_MODEL
    block_size: int = 16  # 128 mirrors vLLM-Ascend
    hbm_tokens: int = DEFAULT_HBM_TOKENS  # per instance
    ddr_tokens: int | None = None  # None = pool_hbm_multiple x instances x hbm_tokens
    pool_hbm_multiple: float = DDR_POOL_FLEET_MULTIPLE
    prefill_tokens_per_s: float = 5000.0
    decode_ms_per_token: float = 35.0
    prefill_overhead_ms: float = 20.0
    prompt_us_per_token: float = 0.0  # per prompt token, cached or not (TimingParams)
    kv_bytes_per_token: int = 256 * 1024
    ddr_gbps: float = 20.0  # GB/s DDR->HBM per device (its link from the pool)
    node_gbps: float = 144.0  # a node's aggregate from the pool; 0 = no limit but its devices'
    pool_gbps: float = 0.0  # the whole pool's aggregate; 0 = no limit
    devices_per_node: int = 8
    transfer_fixed_ms: float = 3.0  # per transfer: metadata lookup, RDMA set-up, scatter
    pool_connector: str = DEFAULT_PROFILE  # whose rules fill and evict the pool (pool_profiles)
    pool_high_watermark: float | None = None  # None: the connector's
    pool_low_watermark: float | None = None
    pool_fail: tuple[PoolWindow, ...] = ()  # windows the pool is down
    pool_slow: tuple[PoolWindow, ...] = ()  # windows the pool keeps a share of its bandwidth
    max_num_seqs: int = 256
    scheduler: str = FCFS  # timing model: fcfs (default) or vllm-steps (emulator.steps)
    max_num_batched_tokens: int = CPU_MAX_NUM_BATCHED_TOKENS  # vllm-steps' budget per step
    time_scale: float = 1.0  # wall seconds per emulated second; 0 = never wait
    seed: int = 0
    pool_url: str | None = None  # join an existing pool instead of hosting one
    no_ddr_pool: bool = False
    pool_port: int = 0
    engine_id: str = "{host}:{port}"  # x-engine-id template: {host}, {port}, {index}
    max_model_len: int = DEFAULT_MAX_MODEL_LEN  # longer prompts refused (context_length)
    processes: int = 1  # processes serving the instances (emulator.processes)
    first_index: int = 0  # index of this process's first instance in the whole fleet
    kv_events_port: int = 0  # first instance's KV event PUB port, the others follow; 0 = off
    kv_events_replay_port: int = 0  # ... and replay (ROUTER) port; 0 = no replay socket
    kv_events_topic: str = "kv"
    roles: tuple[str, ...] = ()  # one Role per instance (prefill/decode); () = all `both`

    def instance_ports(self) -> tuple[int, ...]:
        """Every instance's port, or () when all take free ports."""
        if self.ports:
            return self.ports
        if self.port:
            return tuple(range(self.port, self.port + self.instances))
        return ()

    def validate(self) -> None:
        """Raise ValueError naming the first bad option."""
        checks = [
            (self.instances >= 1, "instances must be >= 1"),
            (0 <= self.port <= 65535 - max(0, self.instances - 1), "port out of range"),
            (not self.ports or len(self.ports) == self.instances,
             f"ports must list one port per instance ({self.instances}), got {len(self.ports)}"),
            (all(1 <= p <= 65535 for p in self.ports), "ports must be 1..65535"),
            (len(set(self.ports)) == len(self.ports), "ports must be distinct"),
            (not (self.ports and self.port), "port and ports exclude each other"),
            (0 <= self.pool_port <= 65535, "pool_port out of range"),
            (self.block_size >= 1, "block_size must be >= 1"),
            (self.hbm_tokens >= 0, "hbm_tokens must be >= 0"),
            (self.ddr_tokens is None or self.ddr_tokens >= 0, "ddr_tokens must be >= 0"),
            (self.prefill_tokens_per_s > 0, "prefill_tokens_per_s must be > 0"),
            (self.decode_ms_per_token >= 0, "decode_ms_per_token must be >= 0"),
            (self.prefill_overhead_ms >= 0, "prefill_overhead_ms must be >= 0"),
            (self.prompt_us_per_token >= 0, "prompt_us_per_token must be >= 0"),
            (self.kv_bytes_per_token >= 0, "kv_bytes_per_token must be >= 0"),
            (self.ddr_gbps > 0, "ddr_gbps must be > 0"),
            (self.node_gbps >= 0, "node_gbps must be >= 0"),
            (self.pool_gbps >= 0, "pool_gbps must be >= 0"),
            (self.devices_per_node >= 1, "devices_per_node must be >= 1"),
            (self.transfer_fixed_ms >= 0, "transfer_fixed_ms must be >= 0"),
            (self.pool_hbm_multiple >= 0, "pool_hbm_multiple must be >= 0"),
            (self.pool_connector in PROFILES,
             f"pool_connector must be one of {', '.join(PROFILES)}, got {self.pool_connector!r}"),
            (0 < self._watermark(low=True) <= self._watermark(low=False) <= 1,
             "pool_low_watermark and pool_high_watermark must satisfy 0 < low <= high <= 1"),
            (self.max_num_seqs >= 1, "max_num_seqs must be >= 1"),
            (self.scheduler in SCHEDULERS,
             f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"),
            (self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1"),
            (self.time_scale >= 0, "time_scale must be >= 0"),
            (self.max_model_len >= 1, "max_model_len must be >= 1"),
            (1 <= self.processes <= self.instances,
             f"processes must be between 1 and the instances ({self.instances})"),
            (self.first_index >= 0, "first_index must be >= 0"),
            (0 <= self.kv_events_port <= 65535 - (self.instances - 1),
             "kv_events_port out of range"),
            (0 <= self.kv_events_replay_port <= 65535 - (self.instances - 1),
             "kv_events_replay_port out of range"),
            (not self.kv_events_replay_port or self.kv_events_port > 0,
             "kv_events_replay_port needs kv_events_port"),
            (not self.roles or len(self.roles) == self.instances,
             f"roles must list one role per instance ({self.instances}), got {len(self.roles)}"),
            (all(r in ROLES for r in self.roles),
             f"roles must each be one of {', '.join(ROLES)}, got {', '.join(self.roles)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        try:
            self.engine_id.format(host="h", port=1, index=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"engine_id template is invalid: {exc}") from exc

    def role(self, i: int) -> Role:
        """Instance ``i``'s role (of this process's instances)."""
        return Role(self.roles[i]) if self.roles else Role.BOTH

    @property
    def pool_profile(self) -> PoolProfile:
        """The connector profile the pool follows."""
        return PROFILES[self.pool_connector]

    def _watermark(self, low: bool) -> float:
        given = self.pool_low_watermark if low else self.pool_high_watermark
        if given is not None:
            return given
        profile = PROFILES.get(self.pool_connector, PROFILES[DEFAULT_PROFILE])
        return profile.low_watermark if low else profile.high_watermark

    @property
    def pool_watermarks(self) -> tuple[float, float]:
        """(high, low) in force: the ones given, or the connector's."""
        return self._watermark(low=False), self._watermark(low=True)

    @property
    def pool_tokens(self) -> int:
        """Capacity of a pool this fleet hosts."""
        if self.ddr_tokens is not None:
            return self.ddr_tokens
        return int(self.pool_hbm_multiple * self.instances * self.hbm_tokens)

    def transfer_params(self) -> TransferParams:
        """The pool's links (0 = no limit becomes None)."""
        return TransferParams(
            device_gbps=self.ddr_gbps,
            node_gbps=self.node_gbps or None,
            pool_gbps=self.pool_gbps or None,
            devices_per_node=self.devices_per_node,
            fixed_ms=self.transfer_fixed_ms,
        )

    @property
    def pool_windows(self) -> tuple[PoolWindow, ...]:
        """Every window the pool is down or slow."""
        return (*self.pool_fail, *self.pool_slow)

    def timing(self) -> TimingParams:
        """Speed parameters in SI units."""
        return TimingParams(
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_s_per_token=self.decode_ms_per_token / 1000.0,
            prefill_overhead_s=self.prefill_overhead_ms / 1000.0,
            prompt_s_per_token=self.prompt_us_per_token / 1e6,
            kv_bytes_per_token=self.kv_bytes_per_token,
            ddr_bytes_per_s=self.ddr_gbps * 1e9,
            max_num_seqs=self.max_num_seqs,
            scheduler=self.scheduler,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )

    def engine_config(self) -> EngineConfig:
        """Per-instance model configuration."""
        return EngineConfig(
            model=self.model,
            block_size=self.block_size,
            hbm_tokens=self.hbm_tokens,
            timing=self.timing(),
            queueing=self.time_scale > 0,
        )
