"""A model service's KV pool as the scheduler sees it: page size, size, and free pages.

Plain Python. The services own their pools; the coordinator learns the size at start
(``ModelInfo``) and the free pages from every step's and release's reply, and plans each
step within them (``Scheduler``).
"""

from __future__ import annotations

from dataclasses import dataclass


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class KVPool:
    """``num_free`` is the last count a reply reported, less what was planned since."""

    name: str  # "target" or "draft", for messages
    page_size: int
    num_pages: int
    num_free: int

    @property
    def num_tokens(self) -> int:
        """Tokens the whole pool holds."""
        return self.num_pages * self.page_size

    def pages(self, num_tokens: int) -> int:
        """Pages a sequence of ``num_tokens`` tokens holds."""
        return cdiv(max(num_tokens, 0), self.page_size)

    def growth(self, held: int, new_len: int) -> int:
        """New pages a sequence holding ``held`` tokens needs to hold ``new_len``."""
        return max(self.pages(new_len) - self.pages(held), 0)

    def tokens_fitting(self, held: int, num_free: int) -> int:
        """Tokens a sequence holding ``held`` can add within ``num_free`` new pages."""
        return (self.pages(held) + num_free) * self.page_size - held
