"""FlashInfer paged attention (CUDA): decode wrapper when every query is one token,
prefill wrapper (causal) otherwise. FP8 pages are read with ``kv_data_type`` fp8 and the
per-layer ``k_scale`` / ``v_scale`` floats, the same function the reference computes.

``flashinfer`` is imported inside the constructor, so importing this module is free.

Steps with an e5m2 cache that are not pure decode run on the reference backend (on the
GPU): FlashInfer 0.6.4's prefill kernel for fp16 queries over e5m2 pages gave results
off by up to 1.33 (e4m3 within 1e-3) on an H200, and its FA3 prefill does not build for
that mix.
"""

from __future__ import annotations

import logging

import torch

from specdec.kernels.attention.base import AttentionBackend, AttentionMetadata, check_heads
from specdec.kernels.attention.reference import ReferenceAttentionBackend

log = logging.getLogger(__name__)

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
        self._reference = ReferenceAttentionBackend()
        self._on_reference = False

    @property
    def runs_flashinfer(self) -> bool:
        """Whether the planned step runs FlashInfer's kernels (else the reference)."""
        return self._step is not None and not self._on_reference

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
        self._on_reference = kv_dtype == torch.float8_e5m2 and not meta.is_decode
        if self._on_reference:
            log.debug("e5m2 prefill step: reference attention (see module docstring)")
            self._reference.plan(meta, num_qo_heads, num_kv_heads, head_dim, q_dtype, kv_dtype)

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
        if self._on_reference:
            return self._reference.forward(layer, q, kv_layer, k_scale, v_scale, sm_scale)
        if self._planned_sm_scale != sm_scale:
            self._plan_wrapper(sm_scale)
        wrapper = self._decode if self._step[0].is_decode else self._prefill
        return wrapper.run(q, kv_layer, k_scale=float(k_scale), v_scale=float(v_scale))
