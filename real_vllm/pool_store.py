"""The shared DDR pool behind real vLLM engines in the test tier, minus vLLM.

Its index is kvgate's own pool service (``emulator/pool_service.py``): which blocks the pool
holds, what a lookup refreshes and what eviction takes are the connector profile's rules, the
same code the emulator and the simulator run. The blocks themselves are files in a directory
every engine sees (under ``/dev/shm``), one per block, named by the block's key. Every call the
connector makes is appended to a log, one JSON object per line.

Standard library only: vLLM's own environment imports this (through
:mod:`real_vllm.pool_connector`), and kvgate's tests exercise it against the real service.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

KEY_BYTES = 8  # the pool service keys blocks by unsigned 64-bit integers
_SUFFIX = ".kv"


def block_key(block_hash: bytes | int) -> int:
    """The pool's key for one of vLLM's block hashes: the first 8 bytes of a sha256 digest (the
    same on every engine with ``--prefix-caching-hash-algo sha256``), or an int hash folded to
    64 bits."""
    if isinstance(block_hash, int):
        return block_hash & 0xFFFF_FFFF_FFFF_FFFF
    return int.from_bytes(bytes(block_hash)[:KEY_BYTES], "big")


class PoolIndex:
    """The pool service over HTTP, synchronously: vLLM calls a connector from its scheduler and
    worker loops, which are not asyncio."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
            return json.loads(reply.read())

    def lookup(self, keys: Sequence[int], skip: int) -> int:
        """Blocks past the first ``skip`` (the engine's HBM hit) the pool serves."""
        return int(self._post("/v1/lookup", {"hashes": list(keys), "skip": skip})["hits"])

    def store(self, keys: Sequence[int], hbm_blocks: int, ddr_blocks: int) -> int:
        """A prefill is done: the profile decides which of the prompt's blocks go in."""
        return int(self._post("/v1/store", {"hashes": list(keys), "hbm_blocks": hbm_blocks,
                                            "ddr_blocks": ddr_blocks})["inserted"])

    def finish(self, prompt: Sequence[int], answer: Sequence[int], hbm_blocks: int,
               ddr_blocks: int) -> int:
        """A request is over (an end-of-request refresh, decode blocks, as the profile says)."""
        return int(self._post("/v1/finish", {"hashes": list(prompt), "answer": list(answer),
                                             "hbm_blocks": hbm_blocks,
                                             "ddr_blocks": ddr_blocks})["inserted"])

    def held(self, keys: Sequence[int]) -> set[int]:
        """Which of ``keys`` the pool holds; refreshes nothing."""
        return set(self._post("/v1/held", {"hashes": list(keys)})["held"])


class BlockFiles:
    """One file per block under ``root``, shared by every engine. Writes and garbage collection
    hold an exclusive lock on the directory, so a block is never collected between its file
    being written and its key entering the index."""

    def __init__(self, root: Path, create: bool = True) -> None:
        self.root = root
        if create:  # a reader of another engine's directory leaves it as it finds it
            root.mkdir(parents=True, exist_ok=True)

    def path(self, key: int) -> Path:
        return self.root / f"{key:016x}{_SUFFIX}"

    @contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self, key: int) -> bytes | None:
        """The block's bytes, or None when its file is gone (evicted since the lookup)."""
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, key: int, data: bytes) -> bool:
        """Write a block unless its file exists; True when written. Call under :meth:`locked`."""
        path = self.path(key)
        if path.exists():
            return False
        partial = path.with_suffix(".part")
        partial.write_bytes(data)
        os.replace(partial, path)
        return True

    def keys(self) -> list[int]:
        return [int(p.stem, 16) for p in self.root.glob(f"*{_SUFFIX}")]

    def collect_garbage(self, index: PoolIndex) -> int:
        """Remove the files of blocks the index no longer holds (evicted, or never admitted);
        returns how many. Call under :meth:`locked`."""
        keys = self.keys()
        held = index.held(keys) if keys else set()
        gone = [k for k in keys if k not in held]
        for key in gone:
            self.path(key).unlink(missing_ok=True)
        return len(gone)


class CallLog:
    """Every connector call, one JSON object per line, appended (both engines may share the
    file: each line is one ``write`` to a file opened for appending)."""

    def __init__(self, path: Path | None, engine: str) -> None:
        self.path = path
        self.engine = engine

    def write(self, call: str, **fields: Any) -> None:
        if self.path is None:
            return
        record = {"t": time.time(), "engine": self.engine, "call": call, **fields}
        with open(self.path, "a") as out:
            out.write(json.dumps(record, separators=(",", ":")) + "\n")


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The records a :class:`CallLog` wrote, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def hex_keys(keys: Sequence[int]) -> list[str]:
    """Keys as the call log writes them (JSON numbers lose 64-bit precision in some readers)."""
    return [f"{k:016x}" for k in keys]
