"""The prefill/decode transfer the real-engine tier puts between its vLLM engines: a directory
under ``/dev/shm`` and the engine flags that attach :mod:`real_vllm.pd_connector` (the same
flags on prefill and decode engines; the request's ``kv_transfer_params`` decide the side)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from real_vllm.fleet import EngineOptions
from real_vllm.pool_store import read_calls
from real_vllm.shared_pool import REPO_ROOT, SHM


@dataclass
class PdTransfer:
    """A fresh transfer directory; ``with`` removes it and whatever is left in it."""

    pull_timeout_s: float = 30.0
    abort_request_timeout_s: float = 480.0
    directory: Path = field(init=False)

    def __post_init__(self) -> None:
        root = SHM if SHM.is_dir() else None
        self.directory = Path(tempfile.mkdtemp(prefix="kvgate-pd-", dir=root))

    @property
    def call_log(self) -> Path:
        return self.directory / "calls.jsonl"

    @property
    def transfers(self) -> Path:
        return self.directory / "requests"

    def calls(self, call: str | None = None) -> list[dict[str, Any]]:
        """The connectors' calls so far, in order (only those named ``call`` if given)."""
        return [c for c in read_calls(self.call_log) if call is None or c["call"] == call]

    def pending(self) -> list[Path]:
        """Request directories no decode engine has pulled (nor expired) yet."""
        if not self.transfers.is_dir():
            return []
        return [r for e in self.transfers.iterdir() if e.is_dir() for r in e.iterdir()]

    def engine_options(self, options: EngineOptions) -> EngineOptions:
        """``options`` with the P/D connector attached; a pull that fails is recomputed
        (``kv_load_failure_policy: recompute``, vLLM's default being to fail the request)."""
        config = {
            "kv_connector": "PdConnector",
            "kv_connector_module_path": "real_vllm.pd_connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "transfer_dir": str(self.transfers),
                "pull_timeout_s": self.pull_timeout_s,
                "abort_request_timeout_s": self.abort_request_timeout_s,
                "call_log": str(self.call_log)},
        }
        return replace(options,
                       extra_args=(*options.extra_args,
                                   "--kv-transfer-config", json.dumps(config)),
                       python_path=str(REPO_ROOT))

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PdTransfer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
