"""FlashInfer paged attention (CUDA): decode wrapper when every query is one token,
prefill wrapper (causal) otherwise. FP8 pages are read with ``kv_data_type`` fp8 and the
per-layer ``k_scale`` / ``v_scale`` floats, the same function the reference computes.

``flashinfer`` is imported inside the constructor, so importing this module is free.
"""

from __future__ import annotations

import torch

from kernels.attention.base import AttentionBackend, AttentionMetadata, check_heads

WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferAttentionBackend(AttentionBackend):
    """Wraps ``BatchPrefillWithPagedKVCacheWrapper`` / ``BatchDecodeWithPagedKVCacheWrapper``.

    The wrappers and their workspace are created once. FlashInfer takes ``sm_scale`` at
    plan time, so the wrapper is (re)planned at the first ``forward`` of a step and again
    only if a later layer passes a different ``sm_scale``.
    """

    def __init__(self, device: str | torch.device = "cuda") -> None:
        import flashinfer

        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"FlashInfer attention needs a CUDA device, got {self.device}")
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._step: tuple | None = None
        self._planned_sm_scale: float | None = None

    def plan(
        self,
        meta: AttentionMetadata,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
    ) -> None:
        check_heads(num_qo_heads, num_kv_heads)
        self._step = (meta, num_qo_heads, num_kv_heads, head_dim, q_dtype, kv_dtype)
        self._planned_sm_scale = None

    def _plan_wrapper(self, sm_scale: float) -> None:
        assert self._step is not None
        meta, num_qo_heads, num_kv_heads, head_dim, q_dtype, kv_dtype = self._step
        # What both wrappers take, in their order (the prefill's ``qo_indptr`` first).
        paged = (meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len)
        paged += (num_qo_heads, num_kv_heads, head_dim, meta.page_size)
        common = dict(sm_scale=sm_scale, q_data_type=q_dtype, kv_data_type=kv_dtype)
        if meta.is_decode:
            self._decode.plan(*paged, **common)
        else:
            self._prefill.plan(meta.qo_indptr, *paged, causal=True, **common)
        self._planned_sm_scale = sm_scale

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        kv_layer: torch.Tensor,
        k_scale: float,
        v_scale: float,
        sm_scale: float,
    ) -> torch.Tensor:
        if self._step is None:
            raise RuntimeError("FlashInferAttentionBackend.forward called before plan")
        if self._planned_sm_scale != sm_scale:
            self._plan_wrapper(sm_scale)
        wrapper = self._decode if self._step[0].is_decode else self._prefill
        return wrapper.run(q, kv_layer, k_scale=float(k_scale), v_scale=float(v_scale))
