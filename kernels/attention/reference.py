"""PyTorch attention over the paged cache: the exact reference, and the CPU fast path.

``plan`` turns the ragged batch into a padded ``[batch, span]`` layout once per step
(``span`` = the longest sequence's pages times the page size): one gather index of whole
K and V page halves, and one additive mask that encodes padding and causality.
``forward`` is then, per layer, one ``index_select`` of contiguous page halves (a few KB
each, so the copy runs at memory speed), one dequantising cast, and one batched
``scaled_dot_product_attention`` on a strided view of the gathered pages, with the GQA
group folded into the query-length dimension so K/V are never repeated per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.kernels.attention.base import AttentionBackend, AttentionMetadata, check_heads
from specdec.kernels.fp8 import fp8_to_float32, is_fp8


@dataclass(frozen=True)
class _Plan:
    batch: int
    max_q: int
    span: int
    num_qo_heads: int
    num_kv_heads: int
    group: int
    head_dim: int
    page_halves: torch.Tensor  # int64 [2 * batch * span / page_size]: K halves, then V
    mask: torch.Tensor | None  # float32 [batch, 1, group * max_q, span]; None = all visible
    q_index: torch.Tensor | None  # int64 [batch * max_q] into q rows (+1 zero row)
    out_index: torch.Tensor | None  # int64 [num_tokens] into the padded output rows


class ReferenceAttentionBackend(AttentionBackend):
    """Exact paged attention in float32 (FlashInfer's FP8 math), on any device."""

    def __init__(self) -> None:
        self._plan: _Plan | None = None

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
        batch, max_q, max_kv = meta.batch_size, meta.max_query_len, meta.max_kv_len
        ps = meta.page_size
        kv_lens = torch.tensor(meta.kv_lens, dtype=torch.int64, device=device)
        q_lens = torch.tensor(meta.query_lens, dtype=torch.int64, device=device)

        # Pages of every sequence, padded with page 0 (masked). In the layer storage
        # [num_pages, 2, page_size, num_kv_heads, head_dim] viewed as [num_pages * 2, -1],
        # row 2 * page holds the page's K and row 2 * page + 1 its V.
        max_pages = -(-max_kv // ps)
        span = max_pages * ps
        padded = [list(pages) + [0] * (max_pages - len(pages)) for pages in meta.page_tables]
        table = torch.tensor(padded, dtype=torch.int64, device=device)
        page_halves = (
            table.view(1, batch, max_pages) * 2 + torch.arange(2, device=device).view(2, 1, 1)
        ).reshape(-1)
        t = torch.arange(span, device=device)

        # Query t of sequence b sits at absolute position start_b + t and sees keys up to
        # it; padded query rows (t >= q_len) see all real keys, so no row is empty (NaN).
        q_t = torch.arange(max_q, device=device)
        start = (kv_lens - q_lens).view(batch, 1)
        limit = torch.minimum(start + q_t, kv_lens.view(batch, 1) - 1)  # [batch, max_q]
        visible = t.view(1, 1, span) <= limit.view(batch, max_q, 1)
        mask = None
        if not bool(visible.all()):
            # Additive float32 (0 / -inf): SDPA would convert a boolean mask every layer.
            hidden = (~visible).unsqueeze(1).expand(batch, group, max_q, span)
            mask = torch.zeros(batch, 1, group * max_q, span, device=device)
            mask.masked_fill_(hidden.reshape(batch, 1, group * max_q, span), float("-inf"))

        q_index = out_index = None
        if max_q > 1 and batch > 1 and any(n != max_q for n in meta.query_lens):
            num_tokens = meta.num_tokens
            qo = meta.qo_indptr.to(torch.int64)
            rows = qo[:-1].view(batch, 1) + q_t.view(1, max_q)
            valid = q_t.view(1, max_q) < q_lens.view(batch, 1)
            q_index = torch.where(valid, rows, torch.full_like(rows, num_tokens)).reshape(-1)
            out_index = (torch.arange(batch, device=device).view(batch, 1) * max_q + q_t)[valid]
        self._plan = _Plan(
            batch=batch,
            max_q=max_q,
            span=span,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            group=group,
            head_dim=head_dim,
            page_halves=page_halves,
            mask=mask,
            q_index=q_index,
            out_index=out_index,
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
        p = self._plan
        if p is None:
            raise RuntimeError("ReferenceAttentionBackend.forward called before plan")
        b, max_q, d = p.batch, p.max_q, p.head_dim
        hkv, g = p.num_kv_heads, p.group
        halves = kv_layer.view(kv_layer.shape[0] * 2, -1)
        if is_fp8(kv_layer.dtype):
            # Gather the bytes, then dequantise only what was gathered (scales are folded
            # into the softmax scale and the output below).
            gathered = halves.view(torch.uint8).index_select(0, p.page_halves)
            kv = fp8_to_float32(gathered.view(kv_layer.dtype))
        else:
            kv = halves.index_select(0, p.page_halves).to(torch.float32)
        # [2, b, span, hkv, d] -> [2, b, hkv, span, d]: a strided view, no copy.
        kv = kv.view(2, b, p.span, hkv, d).transpose(2, 3)

        qf = q.to(torch.float32)
        if p.q_index is not None:
            qf = torch.cat([qf, qf.new_zeros(1, p.num_qo_heads, d)]).index_select(0, p.q_index)
        # [b * max_q, hq, d] -> [b, hkv, g * max_q, d]: the group rides in the query dim.
        qf = qf.view(b, max_q, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * max_q, d)
        out = F.scaled_dot_product_attention(
            qf, kv[0], kv[1], attn_mask=p.mask, scale=sm_scale * k_scale
        )
        if v_scale != 1.0:
            out = out * v_scale
        out = out.view(b, hkv, g, max_q, d).permute(0, 3, 1, 2, 4).reshape(b * max_q, -1, d)
        if p.out_index is not None:
            out = out.index_select(0, p.out_index)
        return out.to(q.dtype)
