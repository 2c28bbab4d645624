"""Per-step attention metadata and the interface every attention backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specdec.kernels.paged_kv_cache import PagedKVCache


@dataclass(frozen=True)
class AttentionMetadata:
    """What one step's attention needs, built once per step and shared by every layer.

    The step's queries are ragged: sequence ``i`` contributes its last ``query_lens[i]``
    positions (``kv_lens[i] - query_lens[i]`` .. ``kv_lens[i] - 1``), concatenated in
    batch order; ``qo_indptr`` delimits them. Each query attends causally to every KV
    position up to and including its own. ``kv_lens`` already include the step's tokens.
    """

    seq_ids: tuple[str, ...]
    query_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int
    qo_indptr: torch.Tensor  # int32 [batch + 1]
    kv_indptr: torch.Tensor  # int32 [batch + 1]
    kv_indices: torch.Tensor  # int32 [kv_indptr[-1]]
    kv_last_page_len: torch.Tensor  # int32 [batch]
    positions: torch.Tensor  # int64 [num_tokens], absolute position of each query (RoPE)
    slot_mapping: torch.Tensor  # int64 [num_tokens], cache slot of each query token
    page_tables: tuple[tuple[int, ...], ...]  # per sequence, pages in token order

    @property
    def batch_size(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_kv_len(self) -> int:
        return max(self.kv_lens, default=0)

    @property
    def is_decode(self) -> bool:
        """Every sequence has exactly one query token (the decode fast path)."""
        return all(n == 1 for n in self.query_lens)


def build_attention_metadata(
    cache: PagedKVCache, seq_ids: list[str], query_lens: list[int]
) -> AttentionMetadata:
    """Metadata for a step whose tokens were already reserved in ``cache``."""
    if len(seq_ids) != len(query_lens):
        raise ValueError("seq_ids and query_lens must have the same length")
    kv_lens = [cache.seq_len(s) for s in seq_ids]
    for seq_id, q, kv in zip(seq_ids, query_lens, kv_lens, strict=True):
        if not 0 < q <= kv:
            raise ValueError(
                f"sequence {seq_id!r}: query_len {q} must be in 1..{kv} (its cached length "
                f"after reserve); call cache.reserve before building the metadata"
            )
    page_tables = tuple(tuple(cache.page_table(s)) for s in seq_ids)
    positions: list[int] = []
    slots: list[int] = []
    ps = cache.page_size
    for pages, q, kv in zip(page_tables, query_lens, kv_lens, strict=True):
        span = range(kv - q, kv)
        positions.extend(span)
        slots.extend(pages[t // ps] * ps + t % ps for t in span)
    qo_indptr = [0]
    for q in query_lens:
        qo_indptr.append(qo_indptr[-1] + q)
    kv_indptr, kv_indices, kv_last_page_len = cache.flashinfer_layout(seq_ids)
    device = cache.device
    return AttentionMetadata(
        seq_ids=tuple(seq_ids),
        query_lens=tuple(query_lens),
        kv_lens=tuple(kv_lens),
        page_size=ps,
        qo_indptr=torch.tensor(qo_indptr, dtype=torch.int32, device=device),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_last_page_len=kv_last_page_len,
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        page_tables=page_tables,
    )


class AttentionBackend(ABC):
    """Paged causal attention over a :class:`PagedKVCache` layer.

    Contract:
    - :meth:`plan` is called once per step, after ``cache.reserve`` and before the
      model's first layer; it may precompute anything that is the same for every layer.
    - :meth:`forward` is called once per layer, after that layer's K/V for the step were
      written to the cache. ``q`` is ``[num_tokens, num_qo_heads, head_dim]`` (RoPE
      applied), ordered as ``meta.qo_indptr``; ``kv_layer`` is ``cache.kv_layers[layer]``.
      Query head ``h`` reads KV head ``h // (num_qo_heads // num_kv_heads)`` (GQA).
    - The result is ``softmax(q·Kᵀ·sm_scale·k_scale + causal mask)·V·v_scale`` with K, V
      the stored (possibly FP8) values, returned in ``q``'s dtype and shape.
    """

    @abstractmethod
    def plan(
        self,
        meta: AttentionMetadata,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
    ) -> None:
        """Prepare the step described by ``meta``."""

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        kv_layer: torch.Tensor,
        k_scale: float,
        v_scale: float,
        sm_scale: float,
    ) -> torch.Tensor:
        """Attention output ``[num_tokens, num_qo_heads, head_dim]`` for one layer."""


def check_heads(num_qo_heads: int, num_kv_heads: int) -> int:
    """Return the GQA group size; ValueError unless it is a whole number."""
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    return num_qo_heads // num_kv_heads
