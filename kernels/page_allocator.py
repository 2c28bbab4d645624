"""Reference-counted KV-cache pages and a content-keyed cache of them: plain Python, no torch."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable


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
    """Hands out page ids in ``[0, num_pages)``, counts their holders, and caches pages by key.

    Every page is in exactly one state: *free*; *held* (reference count >= 1); or
    *evictable* (no holder, but registered under a key, so ``lookup`` still finds its
    content). ``allocate`` takes free pages first (LIFO, which keeps the working set
    small), then evicts the least recently released evictable page. A key names at most
    one page and a page has at most one key. All-or-nothing; double frees refused.
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        # A stack: pop() returns the lowest id first on a fresh allocator.
        self._free = list(range(num_pages - 1, -1, -1))
        self._refs: dict[int, int] = {}  # held page -> number of holders
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._page_of: dict[Hashable, int] = {}
        self._key_of: dict[int, Hashable] = {}

    @property
    def num_free(self) -> int:
        """Pages ``allocate`` can hand out: free ones and evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Pages registered under a key, held or evictable."""
        return len(self._key_of)

    def refcount(self, page: int) -> int:
        return self._refs.get(page, 0)

    def allocate(self, n: int) -> list[int]:
        """Return ``n`` distinct pages, each with one holder, or raise OutOfPagesError and
        allocate none. Evicting a cached page unregisters its key."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages ({n})")
        if n > self.num_free:
            raise OutOfPagesError(n, self.num_free)
        return [self._take() for _ in range(n)]

    def free(self, pages: Iterable[int]) -> None:
        """Drop one holder of each page (a page listed twice loses two). A page left with
        none becomes evictable if it has a key (at the most recently used end), else
        free. ValueError, and no change, if a page has fewer holders than that."""
        pages = list(pages)
        bad = [p for p, n in Counter(pages).items() if n > self.refcount(p)]
        if bad:
            raise ValueError(f"pages {bad} are not allocated (double free?)")
        # Reversed: the first page of a freed run is the next one handed out, and a
        # sequence's later blocks (useless without the earlier ones) are evicted first.
        for page in reversed(pages):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                del self._refs[page]
                self._release(page)

    def share(self, pages: Iterable[int]) -> None:
        """Add a holder to each page, held or evictable (a cached page ``lookup`` found);
        an evictable one leaves the LRU. ValueError, and no change, if one is neither."""
        pages = list(pages)
        bad = [p for p in pages if p not in self._refs and p not in self._evictable]
        if bad:
            raise ValueError(f"pages {bad} are neither held nor cached")
        for page in pages:
            self._evictable.pop(page, None)
            self._refs[page] = self.refcount(page) + 1

    def publish(self, page: int, key: Hashable) -> None:
        """Register a held page under ``key`` for ``lookup``. A no-op if the key already
        names a page (the content is cached already). ValueError if the page is not held
        or has another key."""
        if page not in self._refs:
            raise ValueError(f"page {page} is not held; only a held page can be published")
        if self._key_of.get(page, key) != key:
            raise ValueError(f"page {page} is published under another key")
        if key not in self._page_of:
            self._page_of[key] = page
            self._key_of[page] = key

    def unpublish(self, page: int) -> None:
        """Forget the page's key (no-op if it has none): its content is about to change.
        An evictable page becomes free."""
        key = self._key_of.pop(page, None)
        if key is None:
            return
        del self._page_of[key]
        if page in self._evictable:
            del self._evictable[page]
            self._free.append(page)

    def lookup(self, key: Hashable) -> int | None:
        """The page registered under ``key``, held or evictable; None if none is."""
        return self._page_of.get(key)

    def _take(self) -> int:
        if self._free:
            page = self._free.pop()
        else:
            page, _ = self._evictable.popitem(last=False)
            del self._page_of[self._key_of.pop(page)]
        self._refs[page] = 1
        return page

    def _release(self, page: int) -> None:
        if page in self._key_of:
            self._evictable[page] = None
        else:
            self._free.append(page)
