"""Per-step forward context: everything the model needs to know about paging, in one object.

The model calls ``ctx.attend(layer, q, k, v)`` and nothing else; it never sees pages,
slots, or scales. A context is built once per step and used by every layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specdec.kernels.decoder_layers import NativeStep


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

    def native_step(self) -> NativeStep | None:
        """This step's paging for ``kernels.decoder_layers`` (all layers in one C call),
        or None when the step must go through ``attend`` layer by layer."""
        return None


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

    def native_step(self) -> NativeStep | None:
        plan = getattr(self.backend, "native_plan", None)
        if plan is None or not self.cache.writes_in_c or not self.write_rows.checked:
            return None
        return NativeStep(
            kv_layers=self.cache.layer_pointers,
            kv_rows=self.write_rows.rows,
            qo_indptr=plan.qo_indptr,
            kv_lens=plan.kv_lens,
            page_indptr=plan.page_indptr,
            page_indices=plan.page_indices,
            page_size=plan.page_size,
            sm_scale=self.sm_scale,
        )
