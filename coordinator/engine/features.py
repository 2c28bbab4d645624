"""The target's features of one request, kept for a draft that reads them (EAGLE-style).

The target returns the final hidden state of every position it computes and keeps
(``VerifyResult.features``); the draft's input for token p is that token and the feature of
position p - 1. The coordinator keeps a request's features from position 0 for as long as
the request runs, so any draft (a restarted one, another replica) can be rebuilt from the
log with them. Rows stay as the wire carries them (bfloat16 bytes): no torch here.
"""

from __future__ import annotations


class FeatureLog:
    """Feature rows of positions [0, num_positions), ``row_bytes`` bytes each. A position
    whose feature the target never computed (a prefix-cache hit) holds zeros: the draft
    proposes worse there, and the output does not change."""

    def __init__(self, row_bytes: int) -> None:
        if row_bytes <= 0:
            raise ValueError("row_bytes must be > 0")
        self.row_bytes = row_bytes
        self._data = bytearray()

    @property
    def num_positions(self) -> int:
        return len(self._data) // self.row_bytes

    @property
    def num_ingestible(self) -> int:
        """Tokens [0, this) have their features: token p needs position p - 1's."""
        return self.num_positions + 1

    def add(self, start: int, rows: bytes) -> None:
        """The rows of positions [start, start + len(rows) / row_bytes); a gap before
        ``start`` is zero-filled, known positions from ``start`` on are replaced."""
        if len(rows) % self.row_bytes:
            raise ValueError(
                f"features of {len(rows)} bytes are not whole rows of {self.row_bytes} bytes"
            )
        if not rows:
            return
        offset = start * self.row_bytes
        if offset > len(self._data):
            self._data.extend(bytes(offset - len(self._data)))
        del self._data[offset:]
        self._data.extend(rows)

    def for_tokens(self, start: int, end: int) -> bytes:
        """The draft's rows for tokens [start, end): positions start - 1 .. end - 2, the
        one before position 0 zeros."""
        if not 0 <= start <= end <= self.num_ingestible:
            raise ValueError(
                f"tokens [{start}, {end}) need features the target has not returned "
                f"({self.num_positions} positions known)"
            )
        if start == end:
            return b""
        first = bytes(self.row_bytes) if start == 0 else b""
        begin = max(start - 1, 0) * self.row_bytes
        return first + bytes(self._data[begin : (end - 1) * self.row_bytes])
