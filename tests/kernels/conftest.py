"""Shared builders for kernel tests: a ragged paged batch and a float64 naive attention."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from specdec.kernels.attention import AttentionMetadata, build_attention_metadata
from specdec.kernels.fp8 import dequantize_fp8, fp8_max, is_fp8, quantize_fp8
from specdec.kernels.paged_kv_cache import PagedKVCache


@dataclass
class RaggedBatch:
    """A cache holding one layer's K/V for several sequences, plus the true values."""

    cache: PagedKVCache
    meta: AttentionMetadata
    q: torch.Tensor  # [num_tokens, num_qo_heads, head_dim], compute dtype
    k: dict[str, torch.Tensor]  # full-precision K per sequence, [kv_len, num_kv_heads, D]
    v: dict[str, torch.Tensor]
    k_scale: float
    v_scale: float

    def stored(self, seq_id: str) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V as the cache holds them (quantised then dequantised for fp8), float64."""
        k, v = self.k[seq_id], self.v[seq_id]
        if is_fp8(self.cache.dtype):
            k = dequantize_fp8(quantize_fp8(k, self.k_scale, self.cache.dtype), self.k_scale)
            v = dequantize_fp8(quantize_fp8(v, self.v_scale, self.cache.dtype), self.v_scale)
        return k.double(), v.double()


def build_ragged_batch(
    prefix_lens: list[int],
    query_lens: list[int],
    *,
    num_qo_heads: int = 6,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    page_size: int = 4,
    kv_dtype: torch.dtype = torch.float32,
    q_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str = "cpu",
) -> RaggedBatch:
    """Sequences with ``prefix_lens`` cached tokens then a step of ``query_lens`` tokens.

    Prefixes are reserved a few tokens at a time, round robin, so each sequence's pages
    are interleaved with the others' (page tables are not contiguous ranges).
    """
    gen = torch.Generator().manual_seed(seed)
    seq_ids = [f"s{i}" for i in range(len(prefix_lens))]
    total = [p + q for p, q in zip(prefix_lens, query_lens, strict=True)]
    num_pages = sum(-(-n // page_size) for n in total) + 3
    cache = PagedKVCache(1, num_pages, page_size, num_kv_heads, head_dim, kv_dtype, device)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    k = {s: randn(n, num_kv_heads, head_dim) for s, n in zip(seq_ids, total, strict=True)}
    v = {s: randn(n, num_kv_heads, head_dim) for s, n in zip(seq_ids, total, strict=True)}
    # Per-tensor scales from amax, as a calibration pass would compute them.
    k_scale = v_scale = 1.0
    if is_fp8(kv_dtype):
        k_scale = max(float(t.abs().max()) for t in k.values()) / fp8_max(kv_dtype)
        v_scale = max(float(t.abs().max()) for t in v.values()) / fp8_max(kv_dtype)

    def write(seq_ids_now: list[str], starts: list[int], counts: list[int]) -> None:
        slots = cache.reserve(seq_ids_now, counts)
        spans = list(zip(seq_ids_now, starts, counts, strict=True))
        ks = torch.cat([k[s][a : a + n] for s, a, n in spans])
        vs = torch.cat([v[s][a : a + n] for s, a, n in spans])
        rows = cache.slot_rows(slots)
        cache.write(0, rows, ks.to(q_dtype), vs.to(q_dtype), k_scale, v_scale)

    for s in seq_ids:
        cache.open(s)
    done = [0] * len(seq_ids)
    while any(d < p for d, p in zip(done, prefix_lens, strict=True)):
        counts = [min(3, p - d) for d, p in zip(done, prefix_lens, strict=True)]
        write(seq_ids, done, counts)
        done = [d + c for d, c in zip(done, counts, strict=True)]
    write(seq_ids, prefix_lens, query_lens)

    meta = build_attention_metadata(cache, seq_ids, query_lens)
    q = randn(sum(query_lens), num_qo_heads, head_dim).to(q_dtype)
    return RaggedBatch(cache, meta, q, k, v, k_scale, v_scale)


def naive_attention(batch: RaggedBatch, sm_scale: float, *, quantised: bool = True) -> torch.Tensor:
    """Float64 causal attention per sequence, per query, from the unpaged K/V."""
    outs = []
    qo = batch.meta.qo_indptr.tolist()
    for i, seq_id in enumerate(batch.meta.seq_ids):
        if quantised:
            k, v = batch.stored(seq_id)
        else:
            k, v = batch.k[seq_id].double(), batch.v[seq_id].double()
        q = batch.q[qo[i] : qo[i + 1]].double()
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        start = k.shape[0] - q.shape[0]
        for t in range(q.shape[0]):
            n = start + t + 1
            scores = torch.einsum("hd,nhd->hn", q[t], k[:n]) * sm_scale
            outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v[:n]))
    return torch.stack(outs)


@pytest.fixture
def ragged_batch():
    return build_ragged_batch


@pytest.fixture
def naive():
    return naive_attention
