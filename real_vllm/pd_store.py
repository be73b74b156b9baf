"""Where a prefill engine leaves a request's KV for a decode engine: files under ``/dev/shm``.

One directory per prefilled request, ``ROOT/<engine id>/<request id>/``: one file per KV block,
named by the prefill engine's block id (:class:`real_vllm.pool_store.BlockFiles`), then a
manifest written last (atomically), so a reader that finds the manifest finds every block. The
decode engine removes the directory once it has read it (NIXL's "notify the prefill side that
the blocks were read"); the prefill engine removes what nobody read within its timeout (vLLM's
``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s by default, ``vllm/envs.py``).

Standard library only: vLLM's own environment imports this (through
:mod:`real_vllm.pd_connector`), and kvgate's default suite tests it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from real_vllm.pool_store import BlockFiles

PORT_ENV = "KVGATE_REAL_VLLM_PORT"  # an engine's API port (real_vllm.fleet sets it)
ABORT_REQUEST_TIMEOUT_S = 480.0  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default (vllm/envs.py)
MANIFEST = "manifest.json"
# Ids become directory names: vLLM's engine ids (uuid4) and request ids (cmpl-..., letters,
# digits, dashes) fit; anything else (a path separator, "..") is refused.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class BadHandoff(ValueError):
    """An engine or request id that cannot name a directory."""


def _checked(kind: str, value: object) -> str:
    text = str(value)
    if not _SAFE_ID.match(text) or ".." in text:
        raise BadHandoff(f"pd handoff: {kind} {text!r} is not an id (letters, digits, . _ -)")
    return text


@dataclass(frozen=True)
class Manifest:
    """What a prefill engine left: its block ids in prompt order, the prompt's tokens they
    hold, and when the files expire (wall clock, seconds)."""

    blocks: list[int]
    tokens: int
    expires: float


class Handoffs:
    """The handoff directories under ``root`` (shared by every engine on the machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def directory(self, engine: str, request: str) -> Path:
        return self.root / _checked("engine id", engine) / _checked("request id", request)

    def write(self, engine: str, request: str, blocks: Iterable[tuple[int, bytes]],
              tokens: int, timeout_s: float = ABORT_REQUEST_TIMEOUT_S) -> int:
        """Write a request's blocks (block id, bytes) then its manifest; bytes written."""
        where = self.directory(engine, request)
        files = BlockFiles(where)
        ids, written = [], 0
        for block, data in blocks:
            files.write(block, data)
            ids.append(block)
            written += len(data)
        manifest = {"blocks": ids, "tokens": tokens, "expires": time.time() + timeout_s}
        partial = where / f"{MANIFEST}.part"
        partial.write_text(json.dumps(manifest))
        os.replace(partial, where / MANIFEST)
        return written

    def manifest(self, engine: str, request: str) -> Manifest | None:
        """The request's manifest, or None while it is being written (or once removed)."""
        try:
            data = json.loads((self.directory(engine, request) / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        return Manifest([int(b) for b in data["blocks"]], int(data["tokens"]),
                        float(data["expires"]))

    def read(self, engine: str, request: str, block: int) -> bytes | None:
        """A block's bytes, or None when gone (expired, or the directory removed)."""
        return BlockFiles(self.directory(engine, request), create=False).read(block)

    def remove(self, engine: str, request: str) -> bool:
        """Free a request's files (read, or never to be read); False when already gone."""
        where = self.directory(engine, request)
        if not where.exists():
            return False
        shutil.rmtree(where, ignore_errors=True)
        return True

    def expire(self, engine: str, now: float | None = None,
               timeout_s: float = ABORT_REQUEST_TIMEOUT_S) -> list[str]:
        """Remove ``engine``'s requests nobody read in time; their ids. A directory without a
        manifest (a write cut short) expires ``timeout_s`` after it was last changed."""
        now = time.time() if now is None else now
        base = self.root / _checked("engine id", engine)
        if not base.is_dir():
            return []
        gone = []
        for where in base.iterdir():
            found = self.manifest(engine, where.name) if _SAFE_ID.match(where.name) else None
            expires = found.expires if found else where.stat().st_mtime + timeout_s
            if expires <= now:
                shutil.rmtree(where, ignore_errors=True)
                gone.append(where.name)
        return gone
