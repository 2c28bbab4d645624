"""Free-list allocator for KV-cache pages: plain Python, no torch."""

from __future__ import annotations

from collections.abc import Iterable


class OutOfPagesError(RuntimeError):
    """Raised when a request needs more KV pages than are free; nothing was allocated.

    ``num_needed`` and ``num_free`` are page counts, so a caller (the scheduler, or the
    service mapping it to RESOURCE_EXHAUSTED) can decide to preempt, shrink the batch or
    retry later.
    """

    def __init__(self, num_needed: int, num_free: int, page_size: int | None = None) -> None:
        self.num_needed = num_needed
        self.num_free = num_free
        tokens = f" ({page_size} tokens per page)" if page_size else ""
        super().__init__(
            f"KV cache is full: need {num_needed} free pages but only {num_free} are free"
            f"{tokens}. Finish or free some sequences, lower max_num_seqs / "
            f"max_num_batched_tokens, or give the cache more pages (more KV memory, or "
            f"--kv-cache-dtype fp8 to halve the bytes per token)."
        )


class PageAllocator:
    """Hands out page ids in ``[0, num_pages)``; all-or-nothing, double frees refused.

    Freed pages are reused first (LIFO), which keeps the working set of pages small.
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        # A stack: pop() returns the lowest id first on a fresh allocator.
        self._free = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Return ``n`` distinct free pages, or raise OutOfPagesError and allocate none."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages ({n})")
        if n > len(self._free):
            raise OutOfPagesError(n, len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the free list. ValueError (and no change) if any is not in use."""
        pages = list(pages)
        bad = [p for p in pages if p not in self._used]
        if bad or len(set(pages)) != len(pages):
            raise ValueError(f"pages {bad or pages} are not allocated (double free?)")
        self._used.difference_update(pages)
        # Reverse so that the first page of the freed run is the next one handed out.
        self._free.extend(reversed(pages))
