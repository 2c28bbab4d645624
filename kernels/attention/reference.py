"""PyTorch attention over the paged cache: the exact reference, and the CPU fast path.

``plan`` turns the ragged batch into a padded ``[batch, max_kv]`` layout once per step:
one gather index into the flattened page storage (ordered K/V, sequence, KV head,
position, so the gather result is already in SDPA's layout) and one boolean mask that
encodes padding and causality. ``forward`` is then, per layer, one ``index_select``, one
dequantising cast and one batched ``scaled_dot_product_attention``, with the GQA group
folded into the query-length dimension so K/V are never repeated per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention.base import AttentionBackend, AttentionMetadata, check_heads
from kernels.fp8 import fp8_to_float32, is_fp8


@dataclass(frozen=True)
class _Plan:
    batch: int
    max_q: int
    max_kv: int
    num_qo_heads: int
    num_kv_heads: int
    group: int
    head_dim: int
    kv_rows: torch.Tensor  # int64 [2 * batch * num_kv_heads * max_kv]
    mask: torch.Tensor | None  # bool [batch, 1, group * max_q, max_kv]; None = all visible
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

        # Page of every (sequence, position); padding positions read page 0 and are masked.
        max_pages = -(-max_kv // ps)
        table = torch.zeros(batch, max_pages, dtype=torch.int64)
        for i, pages in enumerate(meta.page_tables):
            table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int64)
        table = table.to(device)
        t = torch.arange(max_kv, device=device)
        page = table[:, t // ps]  # [batch, max_kv]
        # Row of (kv, page, offset, head) in kv_layer.view(-1, head_dim):
        # ((page * 2 + kv) * page_size + offset) * num_kv_heads + head.
        token_row = (page * (2 * ps) + t % ps) * num_kv_heads  # [batch, max_kv]
        kv_part = torch.arange(2, device=device).view(2, 1, 1, 1) * (ps * num_kv_heads)
        heads = torch.arange(num_kv_heads, device=device).view(1, 1, num_kv_heads, 1)
        kv_rows = (token_row.view(1, batch, 1, max_kv) + kv_part + heads).reshape(-1)

        # Query t of sequence b sits at absolute position start_b + t and sees keys up to
        # it; padded query rows (t >= q_len) see all real keys, so no row is empty (NaN).
        q_t = torch.arange(max_q, device=device)
        start = (kv_lens - q_lens).view(batch, 1)
        limit = torch.minimum(start + q_t, kv_lens.view(batch, 1) - 1)  # [batch, max_q]
        visible = t.view(1, 1, max_kv) <= limit.view(batch, max_q, 1)
        mask = None
        if not bool(visible.all()):
            mask = visible.unsqueeze(1).expand(batch, group, max_q, max_kv)
            mask = mask.reshape(batch, 1, group * max_q, max_kv).contiguous()

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
            max_kv=max_kv,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            group=group,
            head_dim=head_dim,
            kv_rows=kv_rows,
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
        b, max_q, max_kv, d = p.batch, p.max_q, p.max_kv, p.head_dim
        hkv, g = p.num_kv_heads, p.group
        if is_fp8(kv_layer.dtype):
            # Gather the bytes, then dequantise only what was gathered (scales are folded
            # into the softmax scale and the output below).
            rows = kv_layer.view(torch.uint8).view(-1, d).index_select(0, p.kv_rows)
            kv = fp8_to_float32(rows.view(kv_layer.dtype))
        else:
            kv = kv_layer.view(-1, d).index_select(0, p.kv_rows).to(torch.float32)
        kv = kv.view(2, b, hkv, max_kv, d)

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
