"""What one sequence contributes to a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SequenceChunk:
    """Append ``token_ids`` to ``seq_id`` and ask for logits at its last ``num_logits`` tokens.

    A prefill chunk (``num_logits`` 0 or 1), a decode token, or a verify segment
    ``[last committed, proposal_1 .. proposal_K]`` with ``num_logits = K + 1``.
    ``num_hidden``: also return the final hidden states (after the last norm) of the last
    ``num_hidden`` tokens (``ModelRunner.forward_chunks``). ``features``: for a model that
    reads the target's features, ``[len(token_ids), hidden]``, the target's final hidden
    state at the position before each token (None: zeros).
    """

    seq_id: str
    token_ids: list[int]
    num_logits: int = 1
    num_hidden: int = 0
    features: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.num_logits <= len(self.token_ids):
            raise ValueError(
                f"sequence {self.seq_id!r}: num_logits={self.num_logits} must be in "
                f"[0, {len(self.token_ids)}] (the chunk's token count)"
            )
        if not 0 <= self.num_hidden <= len(self.token_ids):
            raise ValueError(
                f"sequence {self.seq_id!r}: num_hidden={self.num_hidden} must be in "
                f"[0, {len(self.token_ids)}] (the chunk's token count)"
            )
        if self.features is not None and self.features.shape[0] != len(self.token_ids):
            raise ValueError(
                f"sequence {self.seq_id!r}: {self.features.shape[0]} feature rows for "
                f"{len(self.token_ids)} tokens"
            )
