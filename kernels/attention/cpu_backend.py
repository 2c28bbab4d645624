"""Paged attention on the CPU: a C kernel that reads the pages in place, for short queries.

The reference backend gathers every sequence's pages into a padded batch each layer and
runs SDPA on it. For decode and verify steps this backend instead walks the page tables
in C (``kernels/csrc``): each K/V byte is read once, nothing is padded, FP8 is decoded
as it is read. Its cost grows with the query rows per KV head, where SDPA's blocked
kernel (and torch's threads) win, so, as FlashInfer splits decode from prefill, steps
whose segments are long (prefill chunks) go to the reference backend. Both compute the
same function and are tested against the same float64 oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.kernels.attention.base import AttentionBackend, AttentionMetadata, check_heads
from specdec.kernels.attention.reference import ReferenceAttentionBackend
from specdec.kernels.fp8 import fp8_code_table, is_fp8
from specdec.kernels.native import load_library

_KINDS = {torch.float32: 0, torch.bfloat16: 1}
_BYTE_TABLE = 2

# Query rows per KV head (longest segment x GQA group) up to which the kernel takes the
# step. Alone it took 0.4-1.2x the reference's time at 2 to 8 rows and 0.95-1.3x at 16
# (batch 8, 100 and 1000 cached tokens, one thread); but a step it takes also runs all
# layers in one C call (kernels.decoder_layers), and whole verify steps then took
# 0.76-0.98x the time at 14 to 36 rows (tiny target at batch 8, 100 and 1000 cached
# tokens; SmolLM2 at batch 4, 1000 cached tokens).
NATIVE_MAX_ROWS = 36


@dataclass(frozen=True)
class _Plan:
    batch: int
    num_tokens: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    kv_dtype: torch.dtype
    max_page: int  # largest page index the step reads
    qo_indptr: torch.Tensor  # int64 [batch + 1]
    kv_lens: torch.Tensor  # int64 [batch]
    page_indptr: torch.Tensor  # int64 [batch + 1]
    page_indices: torch.Tensor  # int64 [page_indptr[-1]]


class CpuAttentionBackend(AttentionBackend):
    """Exact paged attention in float32 on the CPU (FlashInfer's FP8 math).

    ``native_max_rows``: steps whose longest segment times the GQA group is at most this
    run the C kernel; longer ones run :class:`ReferenceAttentionBackend`. Raises
    ``NativeBuildError`` when the kernel cannot be built here.
    """

    def __init__(self, native_max_rows: int = NATIVE_MAX_ROWS) -> None:
        self._kernel = load_library().specdec_paged_attention
        self.native_max_rows = native_max_rows
        self._reference = ReferenceAttentionBackend()
        self._planned = False
        self._plan: _Plan | None = None  # None: the planned step goes to the reference

    @property
    def native_plan(self) -> _Plan | None:
        """The planned step's tables when it runs the C kernel (else None)."""
        return self._plan if self._planned else None

    @property
    def uses_native_kernel(self) -> bool:
        """Whether the planned step runs the C kernel (else the reference)."""
        return self._planned and self._plan is not None

    def plan(
        self,
        meta: AttentionMetadata,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
    ) -> None:
        group = check_heads(num_qo_heads, num_kv_heads)
        device = meta.qo_indptr.device
        if device.type != "cpu":
            raise ValueError(f"the cpu attention backend runs on the CPU, not on {device}")
        if kv_dtype not in _KINDS and not is_fp8(kv_dtype):
            raise ValueError(f"the cpu attention backend cannot read a {kv_dtype} KV cache")
        self._planned = True
        if meta.max_query_len * group > self.native_max_rows:
            self._plan = None
            self._reference.plan(meta, num_qo_heads, num_kv_heads, head_dim, q_dtype, kv_dtype)
            return
        page_indices = meta.kv_indices.to(torch.int64)
        spans = zip(meta.kv_indptr.diff().tolist(), meta.query_lens, meta.kv_lens, strict=True)
        if any(n * meta.page_size < kv or q > kv for n, q, kv in spans):
            raise ValueError(
                "attention metadata is inconsistent: every sequence needs query_len <= kv_len "
                "and pages for all kv_len tokens (build it with build_attention_metadata)"
            )
        self._plan = _Plan(
            batch=meta.batch_size,
            num_tokens=meta.num_tokens,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=meta.page_size,
            kv_dtype=kv_dtype,
            max_page=int(page_indices.max()) if page_indices.numel() else -1,
            qo_indptr=meta.qo_indptr.to(torch.int64),
            kv_lens=torch.tensor(meta.kv_lens, dtype=torch.int64),
            page_indptr=meta.kv_indptr.to(torch.int64),
            page_indices=page_indices,
        )

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        kv_layer: torch.Tensor,
        k_scale: float,
        v_scale: float,
        sm_scale: float,
    ) -> torch.Tensor:
        if not self._planned:
            raise RuntimeError("CpuAttentionBackend.forward called before plan")
        p = self._plan
        if p is None:
            return self._reference.forward(layer, q, kv_layer, k_scale, v_scale, sm_scale)
        expected_q = (p.num_tokens, p.num_qo_heads, p.head_dim)
        q_dtype = q.dtype
        expected_kv = (2, p.page_size, p.num_kv_heads, p.head_dim)
        if tuple(q.shape) != expected_q:
            raise ValueError(f"q has shape {tuple(q.shape)}, the plan expects {expected_q}")
        if tuple(kv_layer.shape[1:]) != expected_kv or kv_layer.shape[0] <= p.max_page:
            raise ValueError(
                f"KV layer of shape {tuple(kv_layer.shape)} does not hold the planned pages "
                f"[> {p.max_page}, *{expected_kv}]"
            )
        if kv_layer.dtype != p.kv_dtype or not kv_layer.is_contiguous():
            raise ValueError(
                f"the KV layer must be a contiguous {p.kv_dtype} tensor (planned), got a "
                f"{'' if kv_layer.is_contiguous() else 'non-contiguous '}{kv_layer.dtype} one"
            )
        table = None
        if is_fp8(p.kv_dtype):
            kind = _BYTE_TABLE
            table = fp8_code_table(p.kv_dtype)
        else:
            kind = _KINDS[p.kv_dtype]
        if q.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != p.head_dim:
            q = q.to(torch.float32).contiguous()  # rows of heads, any token stride, is fine
        out = torch.empty(expected_q, dtype=torch.float32)
        status = self._kernel(
            q.data_ptr(),
            q.stride(0),
            kv_layer.data_ptr(),
            kind,
            None if table is None else table.data_ptr(),
            p.qo_indptr.data_ptr(),
            p.kv_lens.data_ptr(),
            p.page_indptr.data_ptr(),
            p.page_indices.data_ptr(),
            p.batch,
            p.num_qo_heads,
            p.num_kv_heads,
            p.head_dim,
            p.page_size,
            sm_scale * k_scale,
            v_scale,
            out.data_ptr(),
        )
        if status != 0:
            raise MemoryError("the cpu attention kernel could not allocate its scratch memory")
        return out.to(q_dtype)
