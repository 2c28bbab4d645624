"""Paged KV storage (FlashInfer's NHD layout) plus per-sequence page tables.

One tensor per layer, ``[num_pages, 2, page_size, num_kv_heads, head_dim]``; index 0 of
dim 1 is K, index 1 is V. A token at position ``t`` of a sequence lives in page
``page_table[t // page_size]`` at offset ``t % page_size``; its flat *slot* is
``page * page_size + offset``. Storage is either the compute dtype or FP8, in which case
:meth:`PagedKVCache.write` quantises with the layer's per-tensor scales.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import torch

from specdec.kernels.fp8 import is_fp8, quantize_fp8
from specdec.kernels.native import NativeBuildError, load_library
from specdec.kernels.page_allocator import OutOfPagesError, PageAllocator

__all__ = ["OutOfPagesError", "PageAllocator", "PagedKVCache", "SlotRows"]


@dataclass(frozen=True)
class SlotRows:
    """Where :meth:`PagedKVCache.write` stores a step's K and V, made by ``slot_rows``."""

    rows: torch.Tensor  # int64 [2 * num_slots]: the K rows, then the V rows
    checked: bool  # bounds-checked, so the C copy may use them


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rows_of_heads(x: torch.Tensor) -> bool:
    """float32 on the CPU, each token's heads one contiguous row (any token stride)."""
    return x.dtype is torch.float32 and x.is_cpu and x.stride(2) == 1 and x.stride(1) == x.shape[2]


class PagedKVCache:
    """KV pages for ``num_layers`` layers and the page table of every open sequence.

    Invariants: an open sequence of length ``n`` holds exactly ``ceil(n / page_size)``
    pages; a page may be held by several sequences (``attach``) and published under a key
    (``publish``, ``lookup``) only while it is full in each of them: a sequence's partial
    last page, the one its next tokens are written to, is its alone and unpublished.
    Every failing call leaves the bookkeeping unchanged.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.num_layers = num_layers
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self._allocator = PageAllocator(num_pages)
        shape = (num_pages, 2, page_size, num_kv_heads, head_dim)
        self.kv_layers: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self._pages: dict[str, list[int]] = {}
        self._lens: dict[str, int] = {}
        self._c_copy = None  # use_cpu_kernels
        self.layer_pointers = (ctypes.c_void_p * num_layers)(
            *(t.data_ptr() for t in self.kv_layers)
        )

    @property
    def writes_in_c(self) -> bool:
        """Whether writes are the C row copy (float32 layers on the CPU, kernels on)."""
        return self._c_copy is not None

    def use_cpu_kernels(self, enabled: bool) -> bool:
        """Write float32 CPU layers with one C call (a row copy per token) instead of
        cat + index_copy_, when ``enabled`` and the kernels build. Returns whether it is on."""
        self._c_copy = None
        if enabled and self.dtype == torch.float32 and self.device.type == "cpu":
            with contextlib.suppress(NativeBuildError):  # no compiler: PyTorch copies
                self._c_copy = load_library().specdec_write_kv
        return self._c_copy is not None

    # ---- sizes -------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return self._allocator.num_pages

    @property
    def num_free_pages(self) -> int:
        """Pages ``reserve`` can take: free ones and cached ones nobody holds (evicted on
        demand, least recently used first)."""
        return self._allocator.num_free

    @property
    def seq_ids(self) -> Iterable[str]:
        return self._pages.keys()

    # ---- sequence bookkeeping ----------------------------------------------------------

    def open(self, seq_id: str) -> None:
        """Start an empty sequence. ValueError if ``seq_id`` is already open."""
        if seq_id in self._pages:
            raise ValueError(f"sequence {seq_id!r} is already open in the KV cache")
        self._pages[seq_id] = []
        self._lens[seq_id] = 0

    def has(self, seq_id: str) -> bool:
        return seq_id in self._pages

    def seq_len(self, seq_id: str) -> int:
        return self._lens[self._check_open(seq_id)]

    def page_table(self, seq_id: str) -> list[int]:
        """The sequence's pages in token order (a copy)."""
        return list(self._pages[self._check_open(seq_id)])

    def reserve(self, seq_ids: list[str], num_new_tokens: list[int]) -> torch.Tensor:
        """Grow each sequence by its count; return the int64 slots of all new tokens.

        Slots are concatenated in batch order. All-or-nothing across the batch: on
        OutOfPagesError (or KeyError for a sequence that is not open) nothing changes.
        """
        if len(seq_ids) != len(num_new_tokens):
            raise ValueError("seq_ids and num_new_tokens must have the same length")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"duplicate sequence ids in one reserve call: {seq_ids}")
        needed = []
        for seq_id, n in zip(seq_ids, num_new_tokens, strict=True):
            self._check_open(seq_id)
            if n < 0:
                raise ValueError(f"num_new_tokens must be >= 0, got {n} for {seq_id!r}")
            new_len = self._lens[seq_id] + n
            needed.append(_cdiv(new_len, self.page_size) - len(self._pages[seq_id]))
        total = sum(needed)
        if total > self._allocator.num_free:
            raise OutOfPagesError(total, self._allocator.num_free, self.page_size)
        new_pages = self._allocator.allocate(total)

        slots: list[int] = []
        cursor = 0
        ps = self.page_size
        for seq_id, n, k in zip(seq_ids, num_new_tokens, needed, strict=True):
            pages = self._pages[seq_id]
            pages.extend(new_pages[cursor : cursor + k])
            cursor += k
            start = self._lens[seq_id]
            slots.extend(pages[t // ps] * ps + t % ps for t in range(start, start + n))
            self._lens[seq_id] = start + n
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def attach(self, seq_id: str, pages: list[int]) -> None:
        """Append full pages other sequences hold or the cache keeps (``lookup``) to a
        sequence whose length is a multiple of ``page_size``: one more holder each, and
        ``page_size`` more tokens per page. ValueError, and no change, otherwise."""
        length = self.seq_len(seq_id)
        if length % self.page_size:
            raise ValueError(
                f"cannot attach pages to {seq_id!r}: its {length} tokens end inside a page"
            )
        self._allocator.share(pages)
        self._pages[seq_id].extend(pages)
        self._lens[seq_id] = length + len(pages) * self.page_size

    def truncate(self, seq_id: str, length: int) -> None:
        """Keep the first ``length`` tokens and drop the pages past them.

        A page the cut leaves partial will be written again, so it is made the sequence's
        alone and unpublished: unpublished where no other sequence holds it, else replaced
        by a private copy (the others keep the published page). A copy needs a page:
        OutOfPagesError, and no change, where none is free.
        """
        current = self.seq_len(seq_id)
        if not 0 <= length <= current:
            raise ValueError(f"cannot truncate {seq_id!r} to {length} tokens: it holds {current}")
        pages = self._pages[seq_id]
        keep = _cdiv(length, self.page_size)
        if length % self.page_size:
            pages[keep - 1] = self._writable(pages[keep - 1])
        self._allocator.free(pages[keep:])
        del pages[keep:]
        self._lens[seq_id] = length

    def _writable(self, page: int) -> int:
        """``page`` unpublished if one sequence holds it, else a private copy of it."""
        if self._allocator.refcount(page) == 1:
            self._allocator.unpublish(page)
            return page
        (copy,) = self._allocator.allocate(1)
        for layer in self.kv_layers:
            layer[copy].copy_(layer[page])
        self._allocator.free([page])
        return copy

    def publish(self, seq_id: str, block: int, key: Hashable) -> None:
        """Register the sequence's full page ``block`` under ``key`` for ``lookup`` (a
        no-op if the key names a page already). ValueError if the page is not full."""
        if (block + 1) * self.page_size > self.seq_len(seq_id):
            raise ValueError(f"block {block} of {seq_id!r} is not full; it cannot be published")
        self._allocator.publish(self._pages[seq_id][block], key)

    def lookup(self, key: Hashable) -> int | None:
        """The page published under ``key`` (held or evictable), or None."""
        return self._allocator.lookup(key)

    def free(self, seq_id: str) -> None:
        """Close the sequence and drop its pages (published ones stay cached, evictable)."""
        self._allocator.free(self._pages[self._check_open(seq_id)])
        del self._pages[seq_id]
        del self._lens[seq_id]

    # ---- data --------------------------------------------------------------------------

    def slot_rows(self, slot_mapping: torch.Tensor) -> SlotRows:
        """Where ``write`` stores the K, then the V, of each slot. ValueError for a slot
        outside the cache when writes go through the C copy, which trusts the rows
        (index_copy_ checks its own).

        Rows of a layer viewed as ``[num_pages * 2 * page_size, num_kv_heads, head_dim]``:
        slot ``s`` is K row ``(s // page_size) * 2 * page_size + s % page_size`` and its V
        row is ``page_size`` further. The same for every layer, so compute it once a step.
        """
        slots = slot_mapping.to(device=self.device, dtype=torch.int64).reshape(-1)
        ps = self.page_size
        checked = self._c_copy is not None
        limit = self.num_pages * ps
        if checked and slots.numel() and not 0 <= int(slots.min()) <= int(slots.max()) < limit:
            raise ValueError(f"slots must lie in [0, {limit})")
        k_rows = (slots // ps) * (2 * ps) + slots % ps
        return SlotRows(torch.cat([k_rows, k_rows + ps]), checked)

    def write(
        self,
        layer: int,
        rows: SlotRows,
        k: torch.Tensor,
        v: torch.Tensor,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """Store ``k``, ``v`` ``[num_tokens, num_kv_heads, head_dim]`` at ``slot_rows(slots)``.

        FP8 caches store ``fp8(clamp(x / scale))``; others store the values cast to the
        cache dtype and ignore the scales.
        """
        if k.shape != v.shape or k.shape[1:] != (self.num_kv_heads, self.head_dim):
            raise ValueError(
                f"k and v must be [num_tokens, {self.num_kv_heads}, {self.head_dim}], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if rows.rows.shape != (2 * k.shape[0],):
            raise ValueError(f"{rows.rows.shape[0] // 2} slots given for {k.shape[0]} tokens")
        storage = self.kv_layers[layer]
        if self._c_copy is not None and rows.checked and _rows_of_heads(k) and _rows_of_heads(v):
            self._c_copy(
                storage.data_ptr(), rows.rows.data_ptr(), k.data_ptr(), k.stride(0),
                v.data_ptr(), v.stride(0), k.shape[0], self.num_kv_heads * self.head_dim,
            )  # fmt: skip
            return
        if is_fp8(self.dtype):
            k = quantize_fp8(k, k_scale, self.dtype)
            v = quantize_fp8(v, v_scale, self.dtype)
        data = torch.cat([k, v]).to(device=self.device, dtype=self.dtype)
        flat = storage.view(-1, self.num_kv_heads, self.head_dim)
        if is_fp8(self.dtype):
            # index_copy_ has no fp8 kernel on CPU; the bytes are what we copy anyway.
            flat, data = flat.view(torch.uint8), data.view(torch.uint8)
        flat.index_copy_(0, rows.rows, data)

    def flashinfer_layout(
        self, seq_ids: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(kv_indptr, kv_indices, kv_last_page_len)`` int32 on the cache device.

        FlashInfer's CSR page table: sequence ``i`` uses pages
        ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]`` and the last one holds
        ``kv_last_page_len[i]`` tokens (in ``1..page_size``; 0 for an empty sequence).
        """
        indptr = [0]
        indices: list[int] = []
        last: list[int] = []
        for seq_id in seq_ids:
            pages = self._pages[self._check_open(seq_id)]
            indices.extend(pages)
            indptr.append(len(indices))
            n = self._lens[seq_id]
            last.append(n - (len(pages) - 1) * self.page_size if pages else 0)

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=self.device)

        return as_tensor(indptr), as_tensor(indices), as_tensor(last)

    def _check_open(self, seq_id: str) -> str:
        if seq_id not in self._pages:
            raise KeyError(f"sequence {seq_id!r} is not open in the KV cache")
        return seq_id
