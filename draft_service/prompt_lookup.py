"""Prompt lookup (n-gram) proposals: copy what followed the context's tail last time.

vLLM's "ngram" speculative method, kept beside the draft model here: a request's output
often repeats its prompt (names, quoted passages, code) or itself, and where the last n
tokens already occurred, the tokens after that occurrence are a proposal that costs no
forward. The draft tries it first and runs its model only where it finds nothing.
"""

from __future__ import annotations

import numpy as np

MAX_NGRAM = 16  # the longest tail looked up (a larger prompt_lookup_max is cut to it)


class TokenHistory:
    """A request's committed token ids, in a buffer that grows by doubling."""

    def __init__(self) -> None:
        self._ids = np.zeros(64, dtype=np.int64)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def ids(self) -> np.ndarray:
        """The ids held (a view)."""
        return self._ids[: self._len]

    def extend(self, token_ids: tuple[int, ...] | list[int]) -> None:
        end = self._len + len(token_ids)
        if end > len(self._ids):
            grown = np.zeros(max(end, 2 * len(self._ids)), dtype=np.int64)
            grown[: self._len] = self._ids[: self._len]
            self._ids = grown
        self._ids[self._len : end] = token_ids
        self._len = end

    def propose(self, extra: tuple[int, ...], ngram: tuple[int, int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the
        context's last n tokens (the history followed by ``extra``), trying n from
        ``ngram[1]`` down to ``ngram[0]``; [] where none occurred."""
        self.extend(extra)
        try:
            return _lookup(self._ids[: self._len], ngram, k)
        finally:
            self._len -= len(extra)


def _lookup(ids: np.ndarray, ngram: tuple[int, int], k: int) -> list[int]:
    n_min, n_max = ngram
    length = len(ids)
    for n in range(min(n_max, MAX_NGRAM, length - 1), n_min - 1, -1):
        tail = ids[length - n :]
        # Occurrences ending before the last token, so that a continuation follows.
        starts = np.flatnonzero(ids[: length - n] == tail[0])
        for offset in range(1, n):
            if not len(starts):
                break
            starts = starts[ids[starts + offset] == tail[offset]]
        if len(starts):
            begin = int(starts[-1]) + n
            return ids[begin : begin + k].tolist()
    return []


def check_ngram(ngram: tuple[int, int]) -> str | None:
    """Why ``(prompt_lookup_min, prompt_lookup_max)`` is not a valid setting, or None.
    ``(0, 0)`` turns lookup off."""
    n_min, n_max = ngram
    if ngram == (0, 0) or 1 <= n_min <= n_max:
        return None
    return (
        "prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max (or both 0: off), "
        f"got {n_min} and {n_max}"
    )
