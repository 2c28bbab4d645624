"""Per-step forward context: everything the model needs to know about paging, in one object.

The model calls ``ctx.attend(layer, q, k, v)`` and nothing else; it never sees pages,
slots, or scales. A context is built once per step and used by every layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


class ForwardContext(ABC):
    """One step's batch: flat token ``positions [T]`` (int64) and an ``attend`` per layer.

    Contract: ``attend`` receives RoPE'd (and k-normed) ``q [T, Hq, D]``, ``k``, ``v``
    ``[T, Hkv, D]`` for the step's tokens in batch order, stores K/V where the context
    keeps them, and returns causal attention over each sequence's cached prefix plus its
    new tokens, ``[T, Hq, D]`` in q's dtype.
    """

    positions: torch.Tensor

    @abstractmethod
    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


@dataclass
class PagedContext(ForwardContext):
    """Attention over the paged KV cache (``kernels.paged_kv_cache`` + an attention backend).

    ``backend.plan`` has already been called for this step; ``write_rows`` is
    ``cache.slot_rows`` of the step's slots; ``k_scales`` / ``v_scales`` are the per-layer
    scales (1.0 when the cache is not FP8).
    """

    positions: torch.Tensor
    write_rows: object  # kernels.paged_kv_cache.SlotRows
    cache: object  # kernels.paged_kv_cache.PagedKVCache
    backend: object  # kernels.attention.AttentionBackend
    k_scales: tuple[float, ...]
    v_scales: tuple[float, ...]
    sm_scale: float

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_scale, v_scale = self.k_scales[layer], self.v_scales[layer]
        self.cache.write(layer, self.write_rows, k, v, k_scale, v_scale)
        return self.backend.forward(
            layer, q, self.cache.kv_layers[layer], k_scale, v_scale, self.sm_scale
        )
