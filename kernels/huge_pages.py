"""Weights on transparent huge pages.

A decode or verify step streams every packed weight once, from cache or memory. Over 4 KiB
pages the bundled target's float16 weights (27 MB) span about 6,700 pages, far more than a
core's TLB holds, so every step also walks the page tables and the walks compete with the
weights for the cache; on 2 MiB pages the same weights need 14 entries. Measured on the
development machine (one thread, a 7-token verify of the bundled target with 2 ms idle
between steps, as in the stack): float16 4.1-4.3 ms against 5.0-5.2 ms on small pages,
float32 6.9-7.0 against 7.6-8.0.

Linux backs an anonymous mapping with huge pages when its transparent huge pages are on
("always", or "madvise" with the mapping advised so, which is the common default); where
they are off, or on other systems, the copy is still correct, on small pages.
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20  # bytes; x86-64 and arm64 Linux's PMD size
ALIGN = 64  # bytes: a cache line, for each tensor in the mapping


def into_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of the CPU ``tensors``, each 64-byte aligned, in one anonymous
    mapping that starts on a huge-page boundary and is advised ``MADV_HUGEPAGE``. The
    copies keep the mapping alive."""
    sizes = [_padded(t.numel() * t.element_size()) for t in tensors]
    if not tensors or not sum(sizes):
        return [t.contiguous() for t in tensors]
    arena = mmap.mmap(-1, sum(sizes) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        arena.madvise(advice)
    raw = torch.frombuffer(arena, dtype=torch.uint8)
    offset = -raw.data_ptr() % HUGE_PAGE
    copies = []
    for tensor, size in zip(tensors, sizes, strict=True):
        nbytes = tensor.numel() * tensor.element_size()
        copy = raw[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
        copies.append(copy.copy_(tensor))
        offset += size
    return copies


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
