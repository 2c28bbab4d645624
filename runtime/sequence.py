"""What one sequence contributes to a step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceChunk:
    """Append ``token_ids`` to ``seq_id`` and ask for logits at its last ``num_logits`` tokens.

    A prefill chunk (``num_logits`` 0 or 1), a decode token, or a verify segment
    ``[last committed, proposal_1 .. proposal_K]`` with ``num_logits = K + 1``.
    """

    seq_id: str
    token_ids: list[int]
    num_logits: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.num_logits <= len(self.token_ids):
            raise ValueError(
                f"sequence {self.seq_id!r}: num_logits={self.num_logits} must be in "
                f"[0, {len(self.token_ids)}] (the chunk's token count)"
            )
